"""Stage: the report. Stored records rendered into a Markdown GO/NO-GO report (Jinja, the
templates under reports/) with its tables and PNG plots."""
