#!/usr/bin/env bash
# The rank faults on two GPUs over NCCL (tests/faults/test_nccl_faults.py, marker multi_gpu) in one
# device call, through the real harness and the real trainer:
#   bash bench/gpu/nccl_faults.sh          (OUT=<dir>; K=<pytest -k expression>; LIMIT=<seconds>, 500)
# Needs two CUDA GPUs (kind nvidia-h100-x2) and py-spy for the harness's stall watch: the device
# image has psutil but no py-spy, so carry .whl/ with py-spy's wheel (bench/gpu/host_stacks.sh); a
# missing psutil is installed from .whl/ too. Writes to $OUT: nccl_faults.log (the whole pytest
# output), nccl_faults.xml (JUnit), reliability_nccl.md (the matrix's "NCCL, two GPUs" section),
# durations.txt (each test's seconds and outcome).
. bench/gpu/device_prologue.sh
LOG=$OUT/nccl_faults.log
device_header "$LOG"
nvidia-smi topo -m 2>&1 | head -5 | tee -a "$LOG"

# py-spy (and psutil, should the image lack it) from the carried wheels, onto PATH/PYTHONPATH for
# the harness and every process it starts (validation/launch/stacks.py looks on PATH)
SITE=/tmp/nccl_faults_site
need=()
command -v py-spy >/dev/null || need+=(py_spy)
python3 -c "import psutil" 2>/dev/null || need+=(psutil)
for name in "${need[@]}"; do
  whl=$(ls .whl/${name}-*.whl 2>/dev/null | head -1)
  if [ -z "$whl" ]; then
    echo "no .whl/${name}-*.whl carried: $name missing (carry .whl)" | tee -a "$LOG"
    continue
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$whl" \
    2>&1 | tail -2 | tee -a "$LOG"
done
if [ -d "$SITE" ]; then
  export PYTHONPATH=$PYTHONPATH:$SITE PATH=$SITE/bin:$PATH
  chmod +x "$SITE"/bin/* 2>/dev/null
fi
{ echo "py-spy: $(command -v py-spy || echo none) $(py-spy --version 2>/dev/null)";
  python3 -c "import psutil, torch; print('psutil', psutil.__version__, '| torch', torch.__version__, '| nccl',
              torch.cuda.nccl.version(), '|', torch.cuda.device_count(), 'GPUs')";
  env | grep -E '^(NCCL_|TORCH_NCCL_|TORCH_SYMM)' | sort; } 2>&1 | tee -a "$LOG"

# the faults' own bounds are seconds; the limit only keeps one hang from eating the call
timeout -k 10 "${LIMIT:-500}" python3 -m pytest tests/faults/test_nccl_faults.py -m multi_gpu \
  ${K:+-k "$K"} -v -rA -p no:cacheprovider --durations=0 --junitxml="$OUT/nccl_faults.xml" \
  --reliability-report "$OUT/reliability_nccl.md" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
echo "pytest exit $rc" | tee -a "$LOG"

python3 - "$OUT/nccl_faults.xml" <<'PY' 2>&1 | tee "$OUT/durations.txt"
# each test's seconds and outcome, then the first lines of each failure
import sys, xml.etree.ElementTree as ET
try:
    cases = ET.parse(sys.argv[1]).getroot().iter("testcase")
except (OSError, ET.ParseError) as exc:
    sys.exit(f"no JUnit XML: {exc}")
failures = []
for c in cases:
    bad = next((c.find(t) for t in ("failure", "error") if c.find(t) is not None), None)
    skip = c.find("skipped")
    outcome = "FAILED" if bad is not None else "skipped" if skip is not None else "passed"
    print(f"{float(c.get('time', 0)):7.1f}s  {outcome:7s}  {c.get('name')}")
    if bad is not None:
        failures.append((c.get("name"), (bad.get("message") or "") + "\n" + (bad.text or "")))
for name, text in failures:
    print(f"\n--- {name}\n" + "\n".join(text.strip().splitlines()[:25]))
PY
exit $rc
