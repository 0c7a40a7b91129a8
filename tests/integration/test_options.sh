#!/bin/bash
# test_options.sh — every subcommand reads its options one way (issue 37, item 8). The option
# table that train, bench, eval, generate and tune share is checked option by option in-process
# by tests/unit/test_options; here, through the program, the options each subcommand parses
# itself (eval's and generate's own, schedule's, tune's, convert's), and for every one:
#   - a missing value at the end of the line is refused by name (exit 2), except a switch or
#     an option whose value may be left out (shown as --name [X] in --help), which runs bare;
#   - an empty value (--name "" and --name=) is refused by name;
#   - a value that is the next word and starts with -- is refused, naming the option;
#   - --name=value is read as --name value (checked where a value is wrong: the same message);
# and an unknown option is refused by name first, placed first, in the middle and last, before
# any other check (a bad value beside it is not what is reported); every --help lists only
# options its subcommand accepts. Every run is one process with nothing to train: each ends at
# the command line, in milliseconds.
. "$(dirname "$0")/../lib/lib.sh"
cd "$WORK"

EVAL_OPTS="batches json"
GENERATE_OPTS="prompt-tokens prompt-file max-new-tokens top-k groups prefill-chunk kv-cache? eot-token temperature
top-p tokens-out logits-out tokenizer"
SCHEDULE_OPTS="stages microbatches schedule chunks-per-rank virtual-stages csv load costs tp grid mem-limit-gb"
TUNE_OPTS="costs costs-selective costs-full json stages ranks batch top verify verify-steps verify-warmup measure
max-microbatches costs-microbatches n-layer mem-cap-gb"
CONVERT_OPTS="to dtype shard-size"

# one CMD ARGS...: run CMD (a single process), output in one.out; its exit status
one() { timeout 60 "$PIPELM" "$@" > one.out 2>&1; }

fails=0 checked=0
# refused NAME WANT_PATTERN CMD ARGS...: exit 2 and a message holding the pattern
refused() {
    local what=$1 pat=$2
    shift 2
    checked=$((checked + 1))
    one "$@"
    local rc=$?
    if [ $rc -ne 2 ] || ! grep -q -F -- "$pat" one.out; then
        fails=$((fails + 1))
        [ $fails -le 20 ] && echo "  $what: exit $rc, want 2 with '$pat': $(head -c 300 one.out | tr '\n' ' ')"
    fi
}

for cmd in eval generate schedule tune convert; do
    case $cmd in
    eval) list=$EVAL_OPTS ;;
    generate) list=$GENERATE_OPTS ;;
    schedule) list=$SCHEDULE_OPTS ;;
    tune) list=$TUNE_OPTS ;;
    convert) list=$CONVERT_OPTS ;;
    esac
    f0=$fails c0=$checked
    # the next word in the checks: another option this subcommand takes
    next=$(echo $list | awk '{print $2}'); next=${next%\?}
    for o in $list; do
        name=${o%\?}
        optional=0
        [ "$name" != "$o" ] && optional=1
        if [ $optional = 0 ]; then
            refused "$cmd --$name (no value)" "--$name needs a value" $cmd --$name
        fi
        refused "$cmd --$name ''" "--$name has an empty value" $cmd --$name ""
        refused "$cmd --$name=" "--$name has an empty value" $cmd --$name=
        if [ $optional = 0 ]; then
            refused "$cmd --$name --$next" "--$name needs a value" $cmd --$name --$next 1
        fi
    done
    # an unknown option first, in the middle and last: named before anything else (the
    # option beside it has a bad value, which is not what is reported)
    first=$(echo $list | awk '{print $1}'); first=${first%\?}
    refused "$cmd unknown first" "unknown option '--nosuch'" $cmd --nosuch 1 --$first ""
    refused "$cmd unknown middle" "unknown option '--nosuch'" $cmd --$first "" --nosuch 1 --$first x
    refused "$cmd unknown last" "unknown option '--nosuch'" $cmd --$first "" --nosuch
    if [ $fails -eq $f0 ]; then ok "$cmd: $((checked - c0)) refusals, every one by name ($(echo $list | wc -w) options)"
    else bad "$cmd" "$((fails - f0)) of $((checked - c0)) checks failed (the first are listed above)"; fi
done

# --name=value is --name value: the same message for the same bad value
one train --steps=-3; a=$(cat one.out)
one train --steps -3; b=$(cat one.out)
[ -n "$a" ] && [ "$a" = "$b" ] && ok "--steps=-3 and --steps -3 are read alike" || bad "= form" "'$a' vs '$b'"
one schedule --stages=2 --microbatches=4 --grid=no
[ $? -eq 0 ] && grep -q bubble one.out && ok "schedule takes --name=value" || bad "schedule =" "$(tail -n 2 one.out)"

# a switch runs bare, and the word after it is the next option, not its value
one train --steps 1 --ckpt-async --progress 0 --log-every 10 --eval-every 0
[ $? -eq 0 ] && ok "a bare --ckpt-async before another option runs" || bad "bare switch" "$(tail -n 2 one.out)"

# eval and generate do not take the optimizer's options; --help shows only what is taken
refused "eval --lr" "unknown option '--lr' for eval" eval --lr 0.1
refused "generate --warmup-steps" "unknown option '--warmup-steps' for generate" generate --warmup-steps 2
refused "generate --json" "unknown option '--json' for generate" generate --json x
for cmd in eval generate; do
    if "$PIPELM" $cmd --help 2>&1 | grep -q -E '^  --(lr|warmup-steps|ckpt-every|save-final) '; then
        bad "$cmd --help" "lists a training option"
    else ok "$cmd --help lists no training option"; fi
done
finish
