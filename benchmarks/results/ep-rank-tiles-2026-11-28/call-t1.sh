# Call T1 (one H200): the MoE experts path's tile sets at decode-batch sizes, one GPU's 128 experts and an EP=2
# rank's 64 (tiles_probe.py).
set -u
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
export PYTHONUNBUFFERED=1
timeout 400 python benchmarks/results/ep-rank-tiles-2026-11-28/tiles_probe.py $OUT/tiles.json 2>&1 | tee $OUT/tiles.log
echo "done in $SECONDS s"
