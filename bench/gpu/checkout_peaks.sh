#!/usr/bin/env bash
# The model step's peak memory (bench/$PEAK_SCRIPT $PEAK_ARGS: model_peak.py, or peak_holders.py for
# what holds it) for this checkout and for each earlier one unpacked under _revs/ (for REV in ...:
# mkdir -p _revs/$REV && git archive $REV nsa bench | tar -x -C _revs/$REV && cp
# bench/model_peak.py bench/peak_holders.py _revs/$REV/bench/), each with its own nsa/
# and bench/ first on the path, in the order REVS names them ("." is this checkout). Back in $OUT:
# checkout_peaks.log.
. bench/gpu/device_prologue.sh
LOG="$OUT/checkout_peaks.log"
device_header "$LOG"
for where in ${REVS:-.}; do
  [ "$where" = . ] && dir=. || dir=_revs/$where
  echo "== $where: bench/${PEAK_SCRIPT:-model_peak.py} ${PEAK_ARGS:---lengths 128k --compiled}" | tee -a "$LOG"
  PYTHONPATH="$PWD/$dir" timeout ${PEAK_S:-150} python3 "$dir/bench/${PEAK_SCRIPT:-model_peak.py}" \
    ${PEAK_ARGS:---lengths 128k --compiled} 2>&1 | grep -v "^W[0-9]" | tee -a "$LOG"
done
