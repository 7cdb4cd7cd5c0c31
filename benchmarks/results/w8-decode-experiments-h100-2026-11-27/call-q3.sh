# Issue 26 (session 2026-11-27d), call Q3: where the W8 GEMV reads its first W tile (infer_quant_w8a8.gemv.EARLY_W:
# 0 after the PDL wait, as now; 1 into registers before it; 2 into L2 before it): one decode step's projections
# (benchmarks/w8_step.py), then Qwen3-8B batch-1 decode (benchmarks.quant_decode) at each, in one process each.
set -u
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
timeout 150 python -m benchmarks.w8_step --out $OUT/w8-step > $OUT/w8-step.log 2>&1; echo "w8_step rc=$?"; grep -E "M=|Error|error" $OUT/w8-step.log
qd() {  # early
  timeout 130 python -c "
import runpy, sys
import infer_quant_w8a8.gemv as g
g.EARLY_W = $1
sys.argv = ['quant_decode', '--out', '$OUT/qd-$1']
runpy.run_module('benchmarks.quant_decode', run_name='__main__')
" > $OUT/qd-$1.log 2>&1; echo "quant_decode early=$1 rc=$?"; grep -E "tok/s" $OUT/qd-$1.log
}
qd 0; qd 1; qd 2
