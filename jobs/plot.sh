#!/bin/bash
# jobs/plot.sh — pictures of a pipelm run with gnuplot (Debian's gnuplot-nox; no Python).
#
#   jobs/plot.sh loss METRICS.jsonl [MORE.jsonl...] OUT.png
#       train loss per step (line), validation loss (points), and the data's entropy floor (the
#       best loss any model can reach; a dashed line) when the "run" line gives it. Several
#       metrics files (a run and its resumptions, in order) make one curve; a step seen twice
#       takes its last value.
#   jobs/plot.sh timeline TRACE.json OUT.png [FROM_MS TO_MS]
#       the pipeline timeline of a Chrome trace (pipelm train --trace FILE): one row per rank,
#       one box per complete ("ph":"X") event. Forward boxes light, backward boxes dark and
#       hatched, both coloured by micro-batch; waits grey (thinner); optimizer tan; sends as
#       black ticks. Time in ms on x; FROM_MS TO_MS zoom in (e.g. on one step).
#
# Inputs are parsed with awk: pipelm writes one JSON object per line (metrics:
# docs/formats.md §6; trace: src/pipeline/trace.c).
set -euo pipefail

me=plot.sh
die() {
    echo "$me: error: $*" >&2
    exit 1
}
usage() {
    sed -n '3,13p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}
command -v gnuplot > /dev/null || die "gnuplot not found (apt-get install gnuplot-nox)"
[ $# -ge 3 ] || usage
what=$1
shift
tmp=$(mktemp -d "${TMPDIR:-/tmp}/pipelm_plot.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# ---- loss ---------------------------------------------------------------------------------
plot_loss() {
    local out=${*: -1} ins=("${@:1:$#-1}") f
    for f in "${ins[@]}"; do [ -r "$f" ] || die "cannot read $f"; done
    # num KEY: the number after "KEY": on the current line ("" for null or absent)
    awk -v dir="$tmp" '
        function num(key,   s) {
            if (!match($0, "\"" key "\":-?[0-9.]+([eE][-+]?[0-9]+)?")) return ""
            s = substr($0, RSTART, RLENGTH); sub(/^"[^"]*":/, "", s); return s
        }
        function str(key,   s) {
            if (!match($0, "\"" key "\":\"[^\"]*\"")) return ""
            s = substr($0, RSTART, RLENGTH); sub(/^"[^"]*":"/, "", s); sub(/"$/, "", s); return s
        }
        /"event":"run"/ {
            floor = num("entropy_floor")
            title = sprintf("%s model, %s parameters, %s stages, %s, %s micro-batches, data %s",
                            str("preset"), num("params"), num("stages"), str("schedule"),
                            num("microbatches"), str("data"))
        }
        /"event":"step"/ { s = num("step"); l = num("loss"); if (s != "" && l != "") train[s + 0] = l }
        /"event":"val"/  { s = num("step"); l = num("val_loss"); if (s != "" && l != "") val[s + 0] = l }
        END {
            n = 0
            for (s in train) { print s, train[s] > (dir "/train.dat"); n++ }
            for (s in val) print s, val[s] > (dir "/val.dat")
            print (floor == "" ? "NaN" : floor) > (dir "/floor")
            print title > (dir "/title")
            print n > (dir "/count")
        }' "${ins[@]}"
    [ "$(cat "$tmp/count")" -gt 0 ] || die "no step lines with a loss in ${ins[*]}"
    sort -n -o "$tmp/train.dat" "$tmp/train.dat"
    [ -f "$tmp/val.dat" ] && sort -n -o "$tmp/val.dat" "$tmp/val.dat"
    local floor title val_plot="" floor_plot=""
    floor=$(cat "$tmp/floor")
    title=$(sed 's/["\\]//g' "$tmp/title")
    [ -s "$tmp/val.dat" ] && val_plot=", '$tmp/val.dat' using 1:2 with points pt 7 ps 1.2 lc rgb '#d62728' title 'validation loss'"
    [ "$floor" != NaN ] && floor_plot=", $floor with lines dt 2 lw 2 lc rgb '#2ca02c' title sprintf('entropy floor %.4f', $floor)"
    if gnuplot <<EOF
set terminal pngcairo size 1200,700 font 'sans,11' noenhanced
set output '$out'
set title "training loss\n$title"
set xlabel 'step'
set ylabel 'loss (nats/token)'
set grid
set key top right box opaque
set offsets 0, 0, graph 0.05, 0
set yrange [0<*:*]
plot '$tmp/train.dat' using 1:2 with lines lw 1.5 lc rgb '#1f77b4' title 'train loss'$val_plot$floor_plot
EOF
    then :; else die "gnuplot failed on ${ins[*]}"; fi
    echo "$me: wrote $out ($(cat "$tmp/count") steps)"
}

# ---- timeline -----------------------------------------------------------------------------
plot_timeline() {
    [ $# -eq 2 ] || [ $# -eq 4 ] || usage
    local trace=$1 out=$2 from=${3:-} to=${4:-}
    [ -r "$trace" ] || die "cannot read $trace"
    # One row per event in kind-specific files: xcenter ycenter halfwidth halfheight rgb [label].
    # Colour per micro-batch: a 10-hue palette; forward mixes it with white, backward with black.
    awk -v dir="$tmp" -v from="$from" -v to="$to" '
        function num(key,   s) {
            if (!match($0, "\"" key "\":-?[0-9.]+([eE][-+]?[0-9]+)?")) return ""
            s = substr($0, RSTART, RLENGTH); sub(/^"[^"]*":/, "", s); return s + 0
        }
        function str(key,   s) {
            if (!match($0, "\"" key "\":\"[^\"]*\"")) return ""
            s = substr($0, RSTART, RLENGTH); sub(/^"[^"]*":"/, "", s); sub(/"$/, "", s); return s
        }
        function mix(c, t, w,   r, g, b) { # c toward t (0 white-ish target or black) by w
            r = int(c / 65536); g = int(c / 256) % 256; b = c % 256
            r = int(r + (t - r) * w); g = int(g + (t - g) * w); b = int(b + (t - b) * w)
            return r * 65536 + g * 256 + b
        }
        BEGIN {
            split("1f77b4 ff7f0e 2ca02c d62728 9467bd 8c564b e377c2 bcbd22 17becf 3b3eac", hex, " ")
            for (i = 1; i <= 10; i++) {
                v = 0
                for (j = 1; j <= 6; j++) v = v * 16 + index("0123456789abcdef", substr(hex[i], j, 1)) - 1
                pal[i - 1] = v
            }
            nev = 0; tmin = -1; tmax = 0; nranks = 0
        }
        /"ph":"M"/ && /"thread_name"/ {
            r = num("tid"); rowname[r] = "rank " r
            if (match($0, /"args":\{"name":"[^"]*"/)) { s = substr($0, RSTART + 16, RLENGTH - 17); rowname[r] = s }
            if (r + 1 > nranks) nranks = r + 1
            next
        }
        /"ph":"X"/ {
            ts = num("ts") / 1000; dur = num("dur") / 1000; r = num("tid")
            if (r + 1 > nranks) nranks = r + 1
            if (from != "" && (ts + dur < from || ts > to)) next
            nev++
            ev_t0[nev] = ts; ev_t1[nev] = ts + dur; ev_r[nev] = r
            ev_name[nev] = str("name"); ev_cat[nev] = str("cat")
            ev_mb[nev] = /"mb":/ ? num("mb") : -1
            if (tmin < 0 || ts < tmin) tmin = ts
            if (ts + dur > tmax) tmax = ts + dur
        }
        END {
            if (nev == 0) { print "0" > (dir "/count"); exit }
            x0 = from != "" ? from : tmin; x1 = to != "" ? to : tmax
            span = x1 - x0 > 0 ? x1 - x0 : 1
            for (i = 1; i <= nev; i++) {
                t0 = ev_t0[i]; t1 = ev_t1[i]; r = ev_r[i]; c = ev_cat[i]; n = ev_name[i]; m = ev_mb[i]
                xc = (t0 + t1) / 2; hw = (t1 - t0) / 2
                col = pal[(m < 0 ? 0 : m) % 10]
                # a label only where it fits (about 2.5% of the shown span)
                lab = (t1 - t0) > 0.025 * span
                if (c == "compute" && n ~ /^F/) {
                    printf "%.6f %d %.6f 0.4 %d\n", xc, r, hw, mix(col, 255, 0.45) > (dir "/fwd.dat")
                    if (lab) printf "%.6f %d F%d\n", xc, r, m > (dir "/labels_fwd.dat")
                } else if (c == "compute" && n ~ /^B/) {
                    printf "%.6f %d %.6f 0.4 %d\n", xc, r, hw, mix(col, 0, 0.3) > (dir "/bwd.dat")
                    if (lab) printf "%.6f %d B%d\n", xc, r, m > (dir "/labels_bwd.dat")
                } else if (c == "wait") {
                    printf "%.6f %d %.6f 0.22 %d\n", xc, r, hw, 11579568 > (dir "/wait.dat")
                } else if (c == "comm" || t1 - t0 <= 0) {
                    printf "%.6f %d\n", t0, r > (dir "/send.dat")
                } else {
                    printf "%.6f %d %.6f 0.3 %d\n", xc, r, hw, 14270074 > (dir "/other.dat")
                    if (lab) printf "%.6f %d %s\n", xc, r, (n ~ /^optim/ ? "opt" : n) > (dir "/labels_other.dat")
                }
            }
            printf "set xrange [%.6f:%.6f]\n", x0, x1 > (dir "/ranges.gp")
            printf "set yrange [%f:-0.7]\n", nranks - 0.3 > (dir "/ranges.gp")
            printf "set ytics (" > (dir "/ranges.gp")
            for (r = 0; r < nranks; r++)
                printf "%s\"%s\" %d", r ? ", " : "", (r in rowname ? rowname[r] : "rank " r), r > (dir "/ranges.gp")
            printf ")\n" > (dir "/ranges.gp")
            print nev > (dir "/count")
            print nranks > (dir "/ranks")
            # more than ~250 boxes per row leaves a few pixels each: no borders, hatch or ticks
            print (nev / nranks > 250 ? 1 : 0) > (dir "/dense")
        }' "$trace"
    [ "$(cat "$tmp/count")" -gt 0 ] || die "no complete (\"ph\":\"X\") events in $trace${from:+ between $from and $to ms}"
    local nranks height plots=()
    nranks=$(cat "$tmp/ranks")
    height=$((220 + 90 * nranks))
    # each layer only if it has events; the hatch goes over the dark backward fill. A dense
    # trace (the whole of a long run) gets plain boxes: borders and hatch would hide the colours.
    local dense bo="border lc rgb '#806020'" bf="border lc rgb '#404040'" bb="border lc rgb '#202020'"
    dense=$(cat "$tmp/dense")
    if [ "$dense" = 1 ]; then
        bo=noborder
        bf=noborder
        bb=noborder
        echo "$me: $(cat "$tmp/count") events: plain boxes; zoom in with FROM_MS TO_MS for details"
    fi
    [ -s "$tmp/wait.dat" ] && plots+=("'$tmp/wait.dat' using 1:2:3:4:5 with boxxyerror fs solid 1 noborder lc rgb variable notitle")
    [ -s "$tmp/other.dat" ] && plots+=("'$tmp/other.dat' using 1:2:3:4:5 with boxxyerror fs solid 1 $bo lc rgb variable notitle")
    [ -s "$tmp/fwd.dat" ] && plots+=("'$tmp/fwd.dat' using 1:2:3:4:5 with boxxyerror fs solid 1 $bf lc rgb variable notitle")
    [ -s "$tmp/bwd.dat" ] && plots+=("'$tmp/bwd.dat' using 1:2:3:4:5 with boxxyerror fs solid 1 $bb lc rgb variable notitle")
    [ -s "$tmp/bwd.dat" ] && [ "$dense" = 0 ] &&
        plots+=("'$tmp/bwd.dat' using 1:2:3:4 with boxxyerror fs transparent pattern 4 noborder lc rgb '#ffffff' notitle")
    [ -s "$tmp/send.dat" ] && [ "$dense" = 0 ] &&
        plots+=("'$tmp/send.dat' using 1:(\$2-0.47):(0):(0.12) with vectors nohead lw 1 lc rgb '#000000' notitle")
    [ -s "$tmp/labels_fwd.dat" ] && plots+=("'$tmp/labels_fwd.dat' using 1:2:3 with labels font 'sans,8' tc rgb '#000000' notitle")
    [ -s "$tmp/labels_bwd.dat" ] && plots+=("'$tmp/labels_bwd.dat' using 1:2:3 with labels boxed bs 1 font 'sans,8' tc rgb '#ffffff' notitle")
    [ -s "$tmp/labels_other.dat" ] && plots+=("'$tmp/labels_other.dat' using 1:2:3 with labels font 'sans,8' tc rgb '#000000' notitle")
    # the legend: keyentry draws a sample without data
    plots+=("keyentry with boxes fs solid 1 border lc rgb '#404040' fc rgb '#9cc3e0' title 'forward (light)'"
        "keyentry with boxes fs solid 1 border lc rgb '#202020' fc rgb '#15537d' title 'backward (dark, hatched)'"
        "keyentry with boxes fs solid 1 noborder fc rgb '#b0b0b0' title 'wait'"
        "keyentry with boxes fs solid 1 border lc rgb '#806020' fc rgb '#d9be7a' title 'optimizer / other'"
        "keyentry with impulses lw 2 lc rgb '#000000' title 'send'")
    local joined
    joined=$(printf '%s, ' "${plots[@]}")
    if gnuplot <<EOF
set terminal pngcairo size 1600,$height font 'sans,11' noenhanced
set output '$out'
set title "pipeline timeline: $(basename "$trace") ($(cat "$tmp/count") events)\ncolour = micro-batch (10 hues, repeating); forward light, backward dark and hatched"
set xlabel 'time (ms)'
load '$tmp/ranges.gp'
set grid xtics
set key outside bottom center horizontal
# backward labels on a dark patch, so the hatch does not hide them
set style textbox 1 opaque fillcolor rgb '#202020' noborder margins 1,1
plot ${joined%, }
EOF
    then :; else die "gnuplot failed on $trace"; fi
    echo "$me: wrote $out ($(cat "$tmp/count") events, $nranks ranks)"
}

case $what in
loss) plot_loss "$@" ;;
timeline) plot_timeline "$@" ;;
*) usage ;;
esac
