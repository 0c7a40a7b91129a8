#!/bin/bash
# test_cli.sh — the command line: help, version, refused flags and values, config files,
# the schedule printer. Single-process runs, each under a timeout.
. "$(dirname "$0")/../lib/lib.sh"
cd "$WORK"
run() { timeout -k 5 60 "$PIPELM" "$@"; }


expect "--version" 0 "^pipelm [0-9]" run --version
expect "--help lists commands" 0 "train" run --help
expect "no arguments is a usage error" 2 "usage" run
expect "train --help lists flags" 0 "--microbatches" run train --help
expect "train --help lists --split" 0 "--split" run train --help
expect "unknown command" 2 "unknown command 'fly'" run fly
expect "unknown flag named" 2 "unknown option '--colour'" run train --colour red
expect "bad integer named" 2 "bad value 'many' for --steps" run train --steps many
expect "bad number named" 2 "bad value '1e' for --lr" run train --lr 1e
expect "missing value" 2 "needs a value" run train --steps
expect "unknown preset" 2 "unknown preset 'huge'" run train --preset huge
# costs for another stage count: refused before any grid is printed (issue 37, item 9)
printf 'stages 2\nstage 0 F 1 B 2 A 3\nstage 1 F 1 B 2 A 5\n' > c2.txt
expect "costs for 2 stages, schedule of 4" 2 "costs are for 2 stages, the schedule has 4" run schedule --stages 4 --microbatches 4 --costs c2.txt
if run schedule --stages 4 --microbatches 4 --costs c2.txt 2>&1 | grep -q 'F0'; then bad "costs mismatch" "the grid was printed first"
else ok "costs mismatch: no grid printed before the refusal"; fi
expect "bad schedule" 2 "must be one of gpipe, 1f1b, zb-h1, interleaved-1f1b, looped-bfs, interleaved-zb, zb-v, dualpipev, or auto" run train --schedule zigzag
expect "batch not divisible" 2 "not divisible by --microbatches" run train --batch 10 --microbatches 4
expect "seq-len too long" 2 "is out of range (1..64, the model's max-seq-len)" run train --seq-len 1000 --steps 1
expect "missing init file" 1 "nope.bin" run train --init nope.bin --steps 1
expect "missing data file" 1 "No such file" run train --data nothere.bin --steps 1
expect "bad lr-schedule" 2 "cosine or constant" run train --lr-schedule linear

# getopt_long: names in full only, '_' as '-', --name=value; --precision checked as it is parsed
expect "abbreviated option refused" 2 "option '--step' is not spelled in full (did you mean --steps?" run train --step 3
expect "abbreviated --name=value refused" 2 "'--microbatch' is not spelled in full" run train --microbatch=2
expect "ambiguous prefix is unknown" 2 "unknown option '--val'" run train --val 3
expect "bench option in train" 2 "unknown option '--warmup' for train: it is a bench option" run train --warmup 1
expect "single-dash word refused" 2 "unexpected argument '-s'" run train -s 3
expect "underscores as dashes" 0 "step     1/1" run train --steps=1 --batch 4 --seq_len 16 --progress 0
expect "train --help lists --precision" 0 "--precision S .*bf16 inputs, fp32 accumulation; --backend onednn or cuda" run train --help
expect "--backend help names the built ones" 0 "--backend S .*compute backend: cpu" run train --help
expect "--precision fp32 runs" 0 "step     1/1" run train --precision fp32 --steps 1 --batch 4 --seq-len 16 --progress 0 --metrics p.jsonl
grep -q '"backend":"cpu","precision":"fp32"' p.jsonl && ok "--precision in the metrics run line" \
    || bad "--precision in metrics" "$(head -c 300 p.jsonl)"
expect "--precision bf16 parses" 2 "steps must be >= 1" run train --precision=bf16 --steps 0
expect "bad precision named" 2 "bad value 'fp16' for --precision (expected fp32 or bf16)" run train --precision fp16
expect "missing precision" 2 "option --precision needs a value" run train --precision

# config file: values apply, the command line wins, unknown keys are refused
printf 'steps = 3\nbatch = 4\nseq_len = 16\nmetrics = cfg.jsonl\n' > run.ini
expect "config file runs" 0 "step     2/2" run train --config run.ini --steps 2 --progress 0
grep -q '"steps":2' cfg.jsonl && grep -q '"batch":4' cfg.jsonl && ok "config + command line merged in metrics" \
    || bad "config merge" "$(head -c 300 cfg.jsonl)"
printf 'stepz = 3\n' > bad.ini
expect "unknown config key" 2 "unknown setting 'stepz'" run train --config bad.ini
expect "missing config file" 2 "cannot open" run train --config none.ini
printf 'precision = fp16\n' > prec.ini
expect "bad precision in config" 2 "prec.ini, line 1: bad value 'fp16' for --precision" run train --config prec.ini

# run options with an environment alias (docs/testing.md): the variable sets the default, a
# config file or the command line wins; the settings in effect are in the metrics run line
opts() { head -n 1 "$1" | grep -o '"bind":[0-9]*,"blas-auto":[0-9]*\|"stop-grace":[0-9.]*' | tr '\n' ' '; }
R1="--steps 1 --batch 4 --seq-len 16 --progress 0"
run train $R1 --metrics o1.jsonl > /dev/null 2>&1
PIPELM_BIND=0 PIPELM_BLAS_AUTO=0 PIPELM_STOP_GRACE=7 run train $R1 --metrics o2.jsonl > /dev/null 2>&1
printf 'bind = 1\nstop_grace = 4\n' > opts.ini
PIPELM_BIND=0 PIPELM_BLAS_AUTO=0 PIPELM_STOP_GRACE=7 run train $R1 --config opts.ini --blas-auto 1 --metrics o3.jsonl \
    > /dev/null 2>&1
if [ "$(opts o1.jsonl)" = '"bind":1,"blas-auto":1 "stop-grace":0 ' ] &&
    [ "$(opts o2.jsonl)" = '"bind":0,"blas-auto":0 "stop-grace":7 ' ] &&
    [ "$(opts o3.jsonl)" = '"bind":1,"blas-auto":1 "stop-grace":4 ' ]; then
    ok "--bind, --blas-auto, --stop-grace: defaults, PIPELM_BIND/BLAS_AUTO/STOP_GRACE aliases, config file and command line win"
else bad "run options and their aliases" "$(opts o1.jsonl)| $(opts o2.jsonl)| $(opts o3.jsonl)"; fi
expect "--bind 2 refused" 2 "\-\-bind must be 0 or 1 (got 2)" run train --bind 2
expect "--stop-grace -1 refused" 2 "\-\-stop-grace must be in \[0, 1e7\] seconds (got -1)" run train --stop-grace -1

# metrics schema: run line first, step lines, val, end last
run train --steps 3 --batch 4 --seq-len 16 --eval-every 2 --metrics m.jsonl --progress 0 > /dev/null 2>&1
head -n 1 m.jsonl | grep -q '"event":"run".*"ranks":1,"stages":1,"split":\[4\],"schedule":"1f1b","microbatches":1,"data":"markov.*"entropy_floor":0\.' \
    && ok "metrics run line" || bad "metrics run line" "$(head -c 400 m.jsonl)"
[ "$(grep -c '"event":"step","step":[0-9]*,"loss":[0-9.]*,"lr":[0-9.e-]*,"grad_norm":[0-9.]*,"step_ms":[0-9.]*,"tokens_per_s":[0-9.]*}' m.jsonl)" -eq 3 ] \
    && ok "metrics step lines" || bad "metrics step lines" "$(grep step m.jsonl | head -c 300)"
grep -q '"event":"val","step":2,"val_loss":' m.jsonl && ok "metrics val line" || bad "metrics val" "missing"
tail -n 1 m.jsonl | grep -q '"event":"end","steps":3,"final_loss":[0-9.]*,"wall_s":' && ok "metrics end line" \
    || bad "metrics end" "$(tail -n 1 m.jsonl)"

# schedule printer and CSV
expect "schedule grid" 0 "bubble" run schedule --stages 4 --microbatches 8 --schedule 1f1b
run schedule --stages 2 --microbatches 2 --schedule gpipe --csv g.csv > /dev/null 2>&1
[ "$(head -n 1 g.csv)" = "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1" ] && ok "schedule CSV row" \
    || bad "schedule CSV" "$(head -n 1 g.csv)"
expect "schedule bad stages" 2 "positive" run schedule --stages 0 --microbatches 2

# llm.c model file round trip through --init / --save-final keeps the weights
run train --steps 1 --save-final w0.bin --progress 0 > /dev/null 2>&1
run train --steps 1 --lr 0 --weight-decay 0 --init w0.bin --save-final w1.bin --progress 0 > /dev/null 2>&1
cmp -s w0.bin w1.bin && ok "--init / --save-final round trip byte-identical (a step at lr 0)" || bad "init round trip" "files differ"
expect "--steps 0 refused" 2 "steps must be >= 1" run train --steps 0
expect "init dims conflict" 2 "conflicts with" run train --init w0.bin --n-embd 32 --steps 1

# the CUDA backend, where it is built, is a module loaded by --backend cuda only: a run on the
# CPU does not load it (no cuBLAS among the process's mappings), a missing module is named
# with its path, and without a GPU the run is refused with the runtime's reason (exit 2)
if run train --help 2>&1 | grep -q -- "--backend S .*| cuda"; then
    # a run long enough to be found (it is stopped once its mappings are read)
    run train --steps 100000 --progress 0 > cpu.out 2>&1 &
    # once it has printed its banner (its libraries are all loaded), the process whose
    # executable is pipelm (not the timeout around it)
    q="" maps=""
    for i in $(seq 1 1000); do
        if grep -q "^model:" cpu.out 2> /dev/null; then
            for p in $(pgrep -f "pipelm train --steps 100000 --progress 0"); do
                [ "$(readlink -f /proc/$p/exe 2> /dev/null)" = "$(readlink -f "$PIPELM")" ] && q=$p
            done
            [ -n "$q" ] && maps=$(cat /proc/$q/maps 2> /dev/null)
            break
        fi
        sleep 0.01
    done
    [ -n "$q" ] && kill "$q" 2> /dev/null
    wait
    if [ -z "$maps" ]; then bad "CPU run maps CUDA" "the run was not found"
    elif ! grep -q "cublas\|cudart" <<< "$maps"; then ok "a CPU run does not map the CUDA libraries"
    else bad "CPU run maps CUDA" "$(grep -o 'lib[a-zA-Z]*cu[a-z]*\.so[.0-9]*' <<< "$maps" | sort -u | head -3)"; fi
    expect "--backend cuda: a missing module named by its path" 2 "module could not be loaded: tried /nonexistent/pipelm_cuda.so (absent)" \
        env PIPELM_CUDA_MODULE=/nonexistent/pipelm_cuda.so timeout 60 "$PIPELM" train --backend cuda --steps 1
    if command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; then
        echo "# a GPU is visible: the no-device refusal is not checked"
    else
        expect "--backend cuda without a GPU: refused with the runtime's reason" 2 "backend cuda cannot run here: no CUDA device" \
            run train --backend cuda --steps 1
    fi
fi

finish
