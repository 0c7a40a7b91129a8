#!/bin/bash
# test_plot.sh — jobs/plot.sh draws a loss curve and a pipeline timeline as PNG files: from
# small hand-made inputs in pipelm's formats, and from a real 2-rank run when pipelm is built.
# Skipped (77) without gnuplot.
. "$(dirname "$0")/../lib/lib.sh"
TOP=${TOP_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
PLOT=$TOP/jobs/plot.sh
if ! command -v gnuplot > /dev/null; then
    echo "SKIP: gnuplot not installed (apt-get install gnuplot-nox)"
    exit 77
fi
cd "$WORK" || exit 1

# is_png FILE: non-empty and starts with the PNG signature
is_png() { [ -s "$1" ] && [ "$(head -c 8 "$1" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ]; }

# ---- hand-made inputs: metrics lines as train.c writes them, trace lines as trace.c writes
{
    echo '{"event":"run","version":"0.1.0","config":{"preset":"tiny","steps":6},"model":{"params":220544},"ranks":2,"stages":2,"split":[2,2],"schedule":"1f1b","microbatches":2,"data":"markov(V=256,branch=4,seed=1)","entropy_floor":0.6586}'
    for s in 1 2 3 4 5 6; do
        echo "{\"event\":\"step\",\"step\":$s,\"loss\":$(echo "5.5 - 0.6 * $s" | bc),\"lr\":0.001,\"grad_norm\":1.0,\"step_ms\":40.0,\"tokens_per_s\":25000.0}"
        [ $((s % 3)) = 0 ] && echo "{\"event\":\"val\",\"step\":$s,\"val_loss\":$(echo "5.4 - 0.6 * $s" | bc)}"
    done
    echo '{"event":"end","steps":6,"final_loss":1.9,"wall_s":0.3}'
} > hand.jsonl
# the same run without a known entropy floor
sed 's/"entropy_floor":0.6586/"entropy_floor":null/' hand.jsonl > nofloor.jsonl
# two ranks, two micro-batches of 1F1B, then the optimizer; times in microseconds
{
    echo '{"displayTimeUnit":"ms","traceEvents":['
    echo '{"name":"thread_name","ph":"M","pid":0,"tid":0,"args":{"name":"rank 0"}},'
    echo '{"name":"F0","cat":"compute","ph":"X","pid":0,"tid":0,"ts":0.000,"dur":1000.000,"args":{"mb":0}},'
    echo '{"name":"send F 0","cat":"comm","ph":"X","pid":0,"tid":0,"ts":1000.000,"dur":0.000,"args":{"mb":0}},'
    echo '{"name":"F1","cat":"compute","ph":"X","pid":0,"tid":0,"ts":1000.000,"dur":1000.000,"args":{"mb":1}},'
    echo '{"name":"wait recv B 0","cat":"wait","ph":"X","pid":0,"tid":0,"ts":2000.000,"dur":1500.000,"args":{"mb":0}},'
    echo '{"name":"B0","cat":"compute","ph":"X","pid":0,"tid":0,"ts":3500.000,"dur":2000.000,"args":{"mb":0}},'
    echo '{"name":"wait recv B 1","cat":"wait","ph":"X","pid":0,"tid":0,"ts":5500.000,"dur":500.000,"args":{"mb":1}},'
    echo '{"name":"B1","cat":"compute","ph":"X","pid":0,"tid":0,"ts":6000.000,"dur":2000.000,"args":{"mb":1}},'
    echo '{"name":"optimizer","cat":"optim","ph":"X","pid":0,"tid":0,"ts":8000.000,"dur":700.000},'
    echo '{"name":"thread_name","ph":"M","pid":0,"tid":1,"args":{"name":"rank 1"}},'
    echo '{"name":"wait recv F 0","cat":"wait","ph":"X","pid":0,"tid":1,"ts":0.000,"dur":1000.000,"args":{"mb":0}},'
    echo '{"name":"F0","cat":"compute","ph":"X","pid":0,"tid":1,"ts":1000.000,"dur":1000.000,"args":{"mb":0}},'
    echo '{"name":"B0","cat":"compute","ph":"X","pid":0,"tid":1,"ts":2000.000,"dur":1500.000,"args":{"mb":0}},'
    echo '{"name":"send B 0","cat":"comm","ph":"X","pid":0,"tid":1,"ts":3500.000,"dur":0.000,"args":{"mb":0}},'
    echo '{"name":"F1","cat":"compute","ph":"X","pid":0,"tid":1,"ts":3500.000,"dur":1000.000,"args":{"mb":1}},'
    echo '{"name":"B1","cat":"compute","ph":"X","pid":0,"tid":1,"ts":4500.000,"dur":1500.000,"args":{"mb":1}},'
    echo '{"name":"optimizer","cat":"optim","ph":"X","pid":0,"tid":1,"ts":6000.000,"dur":700.000}'
    echo ']}'
} > hand_trace.json

if "$PLOT" loss hand.jsonl loss.png > loss.out 2>&1 && is_png loss.png; then
    ok "loss plot from hand-made metrics ($(wc -c < loss.png) bytes)"
else
    bad "loss plot" "$(tail -n 3 loss.out)"
fi
if "$PLOT" loss nofloor.jsonl nofloor.png > nofloor.out 2>&1 && is_png nofloor.png; then
    ok "loss plot without an entropy floor"
else
    bad "loss plot, null floor" "$(tail -n 3 nofloor.out)"
fi
if "$PLOT" timeline hand_trace.json timeline.png > timeline.out 2>&1 && is_png timeline.png; then
    ok "timeline from a hand-made trace ($(wc -c < timeline.png) bytes)"
else
    bad "timeline" "$(tail -n 3 timeline.out)"
fi
if "$PLOT" timeline hand_trace.json zoom.png 1.5 4.5 > zoom.out 2>&1 && is_png zoom.png; then
    ok "timeline zoomed to 1.5-4.5 ms"
else
    bad "timeline zoom" "$(tail -n 3 zoom.out)"
fi
# bad inputs fail with a message, and write nothing
if ! "$PLOT" loss missing.jsonl x.png > miss.out 2>&1 && grep -q "cannot read" miss.out && [ ! -e x.png ]; then
    ok "a missing input is an error"
else
    bad "missing input" "$(cat miss.out)"
fi
echo '{"event":"run","entropy_floor":null}' > empty.jsonl
if ! "$PLOT" loss empty.jsonl y.png > empty.out 2>&1 && grep -q "no step lines" empty.out; then
    ok "metrics without steps is an error"
else
    bad "metrics without steps" "$(cat empty.out)"
fi
if ! "$PLOT" timeline hand.jsonl z.png > nox.out 2>&1 && grep -q "no complete" nox.out; then
    ok "a file without trace events is an error"
else
    bad "trace without events" "$(cat nox.out)"
fi

# ---- real files from a 2-rank run ---------------------------------------------------------
if [ -x "$PIPELM" ]; then
    targs=(--trace run_trace.json)
    if mpirun_t 120 2 train --preset tiny --steps 12 --batch 8 --seq-len 32 --microbatches 2 --eval-every 6 \
        --progress 0 --metrics run.jsonl "${targs[@]}" > run.out 2>&1; then
        if "$PLOT" loss run.jsonl run_loss.png > run_loss.out 2>&1 && is_png run_loss.png; then
            ok "loss plot of a real run"
        else
            bad "loss plot of a real run" "$(tail -n 3 run_loss.out)"
        fi
        if "$PLOT" timeline run_trace.json run_tl.png > run_tl.out 2>&1 && is_png run_tl.png; then
            ok "timeline of a real run"
        else
            bad "timeline of a real run" "$(tail -n 3 run_tl.out)"
        fi
    else
        bad "2-rank run for real inputs" "exit status $? ($(tail -n 3 run.out | tr '\n' ' '))"
    fi
else
    bad "real inputs" "no pipelm binary at $PIPELM"
fi
finish
