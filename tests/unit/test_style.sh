#!/bin/bash
# The shape rules of the sources (issue 21), checked so they stay true:
#  - no function in src/ is longer than 80 lines (signature to closing brace, tests/lib/funclen.awk);
#  - outside the architecture files (model/archs/*.c, model/arch.c) no code asks which
#    architecture it is: everything else goes through the architecture table (arch.h);
#  - the op list is written once (backend_ops.h): no backend table or profiler names an op
#    that only the list and the implementations may name;
#  - docs/architecture.md names every source file and header, and holds the include graph
#    docs/include_graph.sh prints from the sources;
#  - includes run down the layers (src/util < backend < model < parallel < formats < ckpt <
#    pipeline < run < cli): an upward edge fails unless tests/lib/upward_edges.txt lists it
#    (the list only shrinks: a listed edge that is gone fails too).
. "$(dirname "$0")/../lib/lib.sh"
top=${TOP_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$top" || exit 1

srcs=$(find src -name '*.c' -o -name '*.cu' -o -name '*.cuh' | sort)
long=$(awk -f tests/lib/funclen.awk $srcs | awk '$1 > 80')
if [ -z "$long" ]; then ok "no function in src/ over 80 lines"; else bad "functions over 80 lines" "$long"; fi

branches=$(grep -n -E 'MODEL_LLAMA|MODEL_GPT2|arch [!=]= *[0-9]|strn?cmp\([^;]*arch[^;]*"(gpt2|llama)"' $srcs |
           grep -v -E '^src/model/(archs/[a-z0-9_]+|arch)\.c:')
if [ -z "$branches" ]; then ok "no architecture branch outside model/archs/ and model/arch.c"
else bad "architecture branches outside the architecture files" "$branches"; fi

# backend_prof.c and backend.c generate from the list; they name no op by hand
named=$(grep -n -E '\b(rope_bwd|swiglu_fwd|layernorm_bwd_weight|matmul_bwd_input)\b' src/backend/backend_prof.c src/backend/backend.c)
if [ -z "$named" ]; then ok "the profiler and the registry name no op (generated from backend_ops.h)"
else bad "the op list is copied" "$named"; fi

missing=
for f in $srcs $(find src -name '*.h' | sort) include/pipelm/*.h; do
    [ -e "$f" ] || continue
    grep -q -F "$(basename "$f")" docs/architecture.md || missing="$missing $f"
done
if [ -z "$missing" ]; then ok "docs/architecture.md names every source file and header"
else bad "docs/architecture.md does not name" "$missing"; fi

if out=$(bash docs/include_graph.sh --check 2>&1); then ok "the include graph in docs/architecture.md is current"
else bad "include graph" "$out"; fi

# the layer order, from the include graph
layers="util backend model parallel formats ckpt pipeline run cli"
layer_rank() { local i=0 l; for l in $layers; do [ "$l" = "$1" ] && { echo $i; return; }; i=$((i + 1)); done; echo -1; }
upward=$(bash docs/include_graph.sh | while read -r f deps; do
    fl=${f%%/*}; [ "$fl" = pipelm ] && continue
    rf=$(layer_rank "$fl")
    for d in $deps; do
        dl=${d%%/*}; [ "$dl" = pipelm ] && continue
        [ "$(layer_rank "$dl")" -gt "$rf" ] && echo "$f -> $d"
    done
done | LC_ALL=C sort)
unknown=$(for f in $(find src -mindepth 1 -maxdepth 1 -type d | sort); do
    [ "$(layer_rank "${f#src/}")" -ge 0 ] || echo "${f#src/}"; done)
listed=$(sed 's/#.*//; s/ *$//; /^$/d' tests/lib/upward_edges.txt | sed 's/  */ /g' | LC_ALL=C sort)
new=$(comm -23 <(echo "$upward") <(echo "$listed") | sed '/^$/d')
gone=$(comm -13 <(echo "$upward") <(echo "$listed") | sed '/^$/d')
if [ -z "$unknown$new$gone" ]; then ok "includes run down the layers ($(echo "$listed" | grep -c .) listed exceptions)"
else bad "layer order" "folders in no layer: ${unknown:-none}; new upward edges: ${new:-none}; listed but gone (remove them from tests/lib/upward_edges.txt): ${gone:-none}"; fi

# the checks can fail: a function of 81 lines is found
printf 'int f(void) {\n%s\n}\n' "$(for i in $(seq 79); do echo '    ;'; done)" > "$WORK/long.c"
if [ "$(awk -f tests/lib/funclen.awk "$WORK/long.c" | awk '{print $1}')" = 81 ]; then ok "funclen.awk counts an 81-line function as 81"
else bad "funclen.awk" "miscounted $(awk -f tests/lib/funclen.awk "$WORK/long.c")"; fi

finish
