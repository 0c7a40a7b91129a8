# tests/lib/funclen.awk — lengths of the C function definitions of the files given (tests/unit/test_style.sh).
# Prints "lines file:line name" for each C function definition (body between a line that is
# "{" or ends with "{" after a top-level signature, and the next "}" in column 0).
FNR==1 { infn=0; sig="" }
!infn && /^[A-Za-z_][A-Za-z0-9_ \*]*[ \*]\**[A-Za-z_][A-Za-z0-9_]*\(/ && !/;[ \t]*$/ { sig=$0; sigline=FNR; if ($0 ~ /\{[ \t]*$/) { infn=1; start=FNR } ; next }
!infn && sig!="" && /^\{/ { infn=1; start=sigline; next }
!infn && sig!="" && /\)[ \t]*\{?[ \t]*$/ { if ($0 ~ /\{[ \t]*$/) { infn=1; start=sigline }; next }
infn && /^\}/ { n=FNR-start+1; name=sig; sub(/\(.*/, "", name); sub(/.*[ \*]/, "", name); printf "%d %s:%d %s\n", n, FILENAME, start, name; infn=0; sig="" ; next }
