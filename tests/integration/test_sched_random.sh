#!/bin/bash
# The schedule property test: random deadlock-free schedules that respect only the true data
# dependencies train the tiny model bit-identically to one process, for P = 1..4 and
# M = 1..8, half of them with two chunks per rank on P = 2 and 3, half of those V-shaped (see
# tests/integration/sched_random.c).
# COUNT schedules per P (520 in all in the full tier, COUNT 130; 160 in the plain tier, COUNT
# 40: every M still drawn 5 times per P, the same properties on a smaller sample, a third of
# the time). Then the validator on random schedules with chunks (--chunks-only), P = 1..6,
# 9 * COUNT draws each.
source "$(dirname "$0")/../lib/lib.sh"
DRIVER=${SCHED_RANDOM:-$(dirname "$PIPELM")/tests/integration/sched_random}
if full_tier; then COUNT=${COUNT:-130}; else COUNT=${COUNT:-40}; fi
start=$(date +%s)
if timeout -k 5 120 "$MPIEXEC" -n 1 "$DRIVER" --dir "$WORK" --reference --count "$COUNT" > p1.out 2>&1; then
    ok "$(tail -n 1 p1.out)"; else bad "P=1 and the references" "$(tail -n 5 p1.out)"; fi
for P in 2 3 4; do
    if timeout -k 5 400 "$MPIEXEC" -n $P "$DRIVER" --dir "$WORK" --count "$COUNT" --seed $P > p$P.out 2>&1; then
        ok "$(tail -n 1 p$P.out)"; else bad "P=$P" "$(tail -n 8 p$P.out)"; fi
done
# the validator alone on chunked schedules (V = 1..3 chunks per rank, stage s on rank s mod P),
# rule-abiding, unordered and drawn without the peers (may deadlock), against the cycle oracle
for P in 1 2 3 4 5 6; do
    if timeout -k 5 120 "$MPIEXEC" -n 1 "$DRIVER" --chunks-only --ranks $P --count "$COUNT" --seed $P > c$P.out 2>&1; then
        ok "$(tail -n 1 c$P.out)"; else bad "chunks P=$P" "$(tail -n 8 c$P.out)"; fi
done
echo "property test: $((4 * COUNT)) schedules trained, $((6 * 9 * COUNT)) chunked ones validated in $(($(date +%s) - start)) s"
rm -f p?.out c?.out
finish
