#!/bin/bash
# Prints the include graph of pipelm's own headers, as docs/architecture.md shows it: one
# line per header and source file (its path under src/ or include/),
# naming the pipelm headers it includes directly (their paths, without ".h"). Run from anywhere in the source tree:
#   docs/include_graph.sh            print the graph
#   docs/include_graph.sh --check    exit 1 if docs/architecture.md does not hold it verbatim
#   docs/include_graph.sh --write    put it into docs/architecture.md, between its markers
top=$(cd "$(dirname "$0")/.." && pwd)
doc=$top/docs/architecture.md

graph() {
    cd "$top" || exit 1
    for f in include/pipelm/*.h $(find src -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh' | LC_ALL=C sort); do
        [ -e "$f" ] || continue
        deps=$(sed -n 's/^#include "\([a-z]*\/[a-z0-9_/]*\)\.h".*/\1/p' "$f" | LC_ALL=C sort -u | tr '\n' ' ')
        printf '%-28s %s\n' "$(echo "$f" | sed 's|^include/||; s|^src/||')" "${deps% }" | sed 's/ *$//'
    done
}

# The graph as the page holds it (the lines inside the fenced block between the markers).
in_doc() { sed -n '/^<!-- include graph: begin -->$/,/^<!-- include graph: end -->$/p' "$doc" | sed '1,2d;$d' | sed '$d'; }

case ${1:-} in
--check)
    if [ "$(graph)" != "$(in_doc)" ]; then
        echo "docs/architecture.md: the include graph is out of date (docs/include_graph.sh --write):" >&2
        diff <(in_doc) <(graph) >&2
        exit 1
    fi ;;
--write)
    graph > "$doc.graph" || exit 1
    awk -v gf="$doc.graph" '
        /^<!-- include graph: begin -->$/ { print; print "```"; while ((getline l < gf) > 0) print l; print "```"; skip = 1; next }
        /^<!-- include graph: end -->$/ { skip = 0 }
        !skip { print }' "$doc" > "$doc.new" && mv "$doc.new" "$doc"
    rm -f "$doc.graph" ;;
*) graph ;;
esac
