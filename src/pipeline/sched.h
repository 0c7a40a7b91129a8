/*
 * sched: pipeline-parallel schedules for pipelm. A schedule says, for each
 * MPI rank (P ranks, M micro-batches per step), the ordered list of actions it
 * performs in one training step: forward and backward computations plus the
 * explicit point-to-point communication actions between neighbouring stages.
 *
 * Virtual stages: a rank may own V >= 1 model chunks. The model is then split
 * into S = P * V stages and global stage s runs on rank s % P as that rank's
 * chunk s / P (torch's and Megatron's loop layout), so activations wrap from
 * the last rank back to rank 0; or, in the V layout (zb-v, dualpipev), on rank
 * s for s < P and 2P-1-s after (the placement map below). With V = 1 stage s
 * is simply rank s.
 * Every action names its GLOBAL stage.
 *
 * Actions are written the way PyTorch's torch.distributed.pipelining writes
 * its _Action objects ("0F3", "1B3", "2RECV_F0", "0SEND_F0", "1SEND_B2",
 * "0RECV_B2"; "5F3" = stage 5's forward of micro-batch 3), and a schedule can
 * be saved and loaded as the same CSV torch's _dump_csv/_load_csv use: one row
 * per rank, comma-separated action strings, no header. The module builds
 * "gpipe", "1f1b", "zb-h1" (one chunk per rank) and "interleaved-1f1b",
 * "looped-bfs", "interleaved-zb" (V chunks per rank), "zb-v" and "dualpipev"
 * (two chunks per rank in a V), validates any schedule
 * (ownership, ordering, send/recv pairing, storage lifetimes, deadlock freedom
 * under blocking receives and non-blocking sends), simulates it with unit
 * costs (F=1, B=2, I=W=1, comm=0) to get the makespan and bubble fraction, and
 * prints it as a rank x time grid.
 * No MPI here: this is pure bookkeeping shared by the engine and the tools.
 */
#ifndef PIPELM_SCHED_H
#define PIPELM_SCHED_H

#include <stddef.h>
#include <stdio.h>

/* action kinds; the order is part of no file format (strings are) */
typedef enum {
    SCHED_F,      /* forward of one micro-batch */
    SCHED_B,      /* full backward (input and weight grads) of one micro-batch */
    SCHED_SEND_F, /* send forward output of mb to stage+1 */
    SCHED_RECV_F, /* receive forward input of mb from stage-1 */
    SCHED_SEND_B, /* send grad of the stage input of mb to stage-1 */
    SCHED_RECV_B, /* receive grad of the stage output of mb from stage+1 */
    SCHED_I,      /* backward, input part: dL/d(stage input) of mb (zero-bubble) */
    SCHED_W       /* backward, weight part: the weight gradients of mb, after its I */
} sched_op;

#define SCHED_NOPS 8

typedef struct {
    sched_op op;
    int stage;
    int mb;
} sched_action;

typedef struct {
    char name[32];         /* "gpipe", "1f1b", or whatever a CSV was called */
    int P, M;              /* ranks (rows), micro-batches per step */
    int *n;                /* n[r] = number of actions of rank r */
    sched_action **acts;   /* acts[r][0..n[r]-1], in execution order */
    int V;                 /* chunks per rank: S = P * V global stages, stage s on rank s % P
                              (chunk s / P). 0 is read as 1, so a struct zeroed by hand and
                              filled with P, M, n, acts is a one-chunk schedule. */
    int place;             /* SCHED_PLACE_LOOP (0, the default of a zeroed struct) or
                              SCHED_PLACE_V: where each global stage runs (see below) */
} sched;

/* Stage placements: the map global stage -> (rank, chunk).
     SCHED_PLACE_LOOP  stage s on rank s % P as chunk s / P (torch's and Megatron's loop).
     SCHED_PLACE_V     the V shape (zigzag for V > 2): chunk c of rank r is stage c P + r for
                       even c and c P + P - 1 - r for odd c; with V = 2 stage s is on rank s
                       for s < P and on rank 2P - 1 - s after, so the first and the last stage
                       are both on rank 0 (torch's style="v", ZB-V's and DualPipeV's layout).
   Two neighbouring stages on one rank (stages P-1 and P under V) hand their activations and
   gradients over in memory: a schedule has no SEND/RECV between them (as torch writes it). */
#define SCHED_PLACE_LOOP 0
#define SCHED_PLACE_V 1
/* The rank of global stage s, its chunk on that rank, and the stage of chunk c on rank r. */
int sched_place_rank(int place, int P, int s);
int sched_place_chunk(int place, int P, int s);
int sched_place_stage(int place, int P, int r, int c);
/* "loop" or "v" (NULL for an unknown placement). */
const char *sched_place_name(int place);
/* The rank of global stage st of schedule s (its placement). */
int sched_stage_rank(const sched *s, int st);
/* The chunks per rank a named schedule runs when none is asked for: 2 for the V-shaped ones
   (zb-v, dualpipev), else 1. */
int sched_default_chunks(const char *name);
/* The placement a named schedule is built with (SCHED_PLACE_V for zb-v and dualpipev). */
int sched_name_place(const char *name);

/* The number of global stages, P * V (V < 1 read as 1); 0 for NULL. */
int sched_nstages(const sched *s);

/* Build a named schedule for P ranks, M micro-batches, one chunk per rank:
   sched_build_chunks(name, P, 1, M, ...). */
int sched_build(const char *name, int P, int M, sched *s, char *err, size_t errlen);

/* Build a named schedule for P ranks with V chunks each (S = P*V stages), M micro-batches.
     gpipe, 1f1b, zb-h1   V must be 1 (refused otherwise, naming the ones that take chunks).
       zb-h1 (Qi et al., ICLR 2024, "H1" memory): 1F1B with every backward split into I
       and W; in the cool-down the I's run as soon as their gradients arrive and the W's
       fill the time the rank would have waited.
     interleaved-1f1b     Narayanan et al. 2021 (Megatron's and torch's
       ScheduleInterleaved1F1B order): the forwards visit the rank's chunks in groups of
       G = ceil(M / rounds) micro-batches, rounds = max(1, floor(M / P)) (depth first),
       warm-up (V-1)G + 2(P-1-r) forwards, then one F one B, then the cool-down. Any M:
       torch takes only M < 2P or M a multiple of its rounds (G = M / rounds); for the
       other M the lists are those of the next multiple of G with the padding micro-batches
       left out, which stays deadlock-free. Unit-cost bubble exactly (P-1)/(V*M) of the
       ideal time when P divides M; M = 1 cannot interleave (same bubble as 1f1b).
     looped-bfs           torch's ScheduleLoopedBFS: every forward of chunk 0, then of
       chunk 1, ...; then the backwards from the last chunk down. Any M; holds V*M.
       The backwards of a stage run in ascending micro-batch order (torch runs them
       descending), as the gradient-order rule below requires.
     interleaved-zb       the zero-bubble form of interleaved-1f1b (torch's
       ScheduleInterleavedZeroBubble, ZB1P): its forward and input-backward order, each
       backward split into I and W, the W's filling the time a rank would wait, with no
       more micro-batches held than interleaved-1f1b. Any M, as interleaved-1f1b.
   With V = 1, interleaved-1f1b, looped-bfs and interleaved-zb are accepted and build
   exactly 1f1b, gpipe and zb-h1 (under their own name).
   The V-shaped ones take V = 2 only and are built with SCHED_PLACE_V (stage r and 2P-1-r on
   rank r):
     zb-v                 Qi et al.'s ZB-V: every backward split into I and W, warm-up
       forwards of chunk 0, then chunk 1's F I W, the steady F I W of both chunks, and the
       cool-down I's with the W's filling the tail; zero unit-cost bubble once M >= 2P-1 at
       1F1B's activation memory. Any M (an M below 2P-1 is built as 2P-1 with the extra
       micro-batches left out, as torch does).
     dualpipev            DeepSeek's DualPipe folded onto P ranks (torch's ScheduleDualPipeV):
       the steady state pairs a forward of one chunk with a full backward of the other (torch
       overlaps them; here they run one after the other), the warm-up's and the tail's
       backwards split into I and W. Any M (torch: M >= 2P; a smaller M is built as 2P with
       the extra micro-batches left out).
   Returns PL_OK; on error PL_EINVAL (a bad name or size; PL_ENOMEM out of memory), err filled
   and *s left empty. */
int sched_build_chunks(const char *name, int P, int V, int M, sched *s, char *err, size_t errlen);

/* Bytes that building, validating and dry-running a P x V x M schedule takes at most, before
   any of it is allocated: every (stage, micro-batch) pair has at most seven actions (F, B or
   I and W, and four sends and receives) of 12 bytes, the dry run keeps two ints per action,
   and the validator a few tables per pair: SCHED_BYTES_PER_PAIR bytes per pair (measured:
   90-120 bytes per pair for 1f1b, zb-h1 and interleaved-zb at 1M-2M pairs). */
#define SCHED_BYTES_PER_PAIR 160.0
double sched_build_bytes(int P, int V, int M);

/* The constraint a schedule puts on M (and what it costs), as one line of text for --help;
   NULL for an unknown name. */
const char *sched_constraint(const char *name);

/* The registry of named schedules (sched_registry.c): one row each. Adding a schedule is its
   generator (its own file, or sched_gen.c) and one row; --help, the messages, the options'
   check, pipelm schedule and the tuner's grid all read the table (docs/contributing.md). */
enum { SCHED_CHUNKS_ONE, SCHED_CHUNKS_ANY, SCHED_CHUNKS_V };
typedef struct {
    const char *name;   /* --schedule NAME */
    int chunks;         /* SCHED_CHUNKS_ONE: one chunk a rank; _ANY: V looped; _V: exactly 2 in a V */
    /* fill a built shell (name, P, V, M, place and capacity set) with every rank's actions;
       G: the interleaved schedules' group size (sched_interleave_group). PL_OK, PL_ENOMEM, or
       PL_ESTATE for a generator that stalls */
    int (*generate)(sched *s, int G);
    const char *rule;   /* what it needs of M and what it costs, for --help */
    int tune_V[3];      /* the chunks per rank pipelm tune tries it with (0 ends the list) */
} sched_kind;
/* The table, ended by a row whose name is NULL. */
extern const sched_kind sched_kinds[];
/* The row named name, or NULL (name may be NULL). */
const sched_kind *sched_kind_find(const char *name);
/* The number of rows. */
int sched_kind_count(void);
/* "gpipe, 1f1b, ..., dualpipev": every name, for messages. */
void sched_kind_names(char *buf, size_t len);

/* Release what sched_build/sched_read_csv allocated; safe on a zeroed sched. */
void sched_free(sched *s);

/* The torch spelling of an op ("F", "B", "SEND_F", ...), or NULL if invalid. */
const char *sched_op_str(sched_op op);

/* Write an action as torch does ("0F3", "2RECV_F0"). PL_OK, or PL_EINVAL for a bad op,
   negative stage/mb, or a buffer too small. */
int sched_action_format(const sched_action *a, char *buf, size_t len);

/* Parse exactly "<stage><op><mb>" (decimal, no sign, no spaces, nothing after).
   PL_OK, or PL_EINVAL: rejected (a is then left untouched). */
int sched_action_parse(const char *str, sched_action *a);

/* Write one CSV row per rank (actions separated by ',', rows by '\n').
   PL_OK, PL_EIO on a write error (PL_EINVAL for an empty schedule or a bad action). */
int sched_write_csv(const sched *s, FILE *f);

/* The largest schedule CSV a reader takes (a 64-stage, 4096-micro-batch schedule is ~10 MB). */
#define SCHED_CSV_MAX_BYTES (64u << 20)

/* Read a schedule CSV (torch's format; '\r\n' line ends, blanks around
   cells and empty cells are tolerated). P = number of rows, M = max mb + 1.
   Stages beyond the rows are chunks: when max stage >= P, S = max stage + 1
   must be a multiple of P (refused otherwise) and V = S / P; else V = 1.
   The placement is the loop one when every action's stage fits it, else the V shape when
   every one fits that (torch's ZB-V and DualPipeV files). torch's overlapped cells
   "(0F3;1B0)OVERLAP_F_B" are read as their sub-actions in order.
   The result is not validated (a stage on the wrong row is sched_validate's
   to refuse); call sched_validate. PL_OK, or PL_EINVAL with err (PL_ENOMEM out of memory,
   PL_EIO a read error). */
int sched_read_csv(FILE *f, const char *name, sched *s, char *err, size_t errlen);

/* Check that the schedule is complete, well ordered, has matched send/recv
   pairs and cannot deadlock when receives block and sends do not. Every rule
   holds per (global stage, micro-batch): stage s only on its rank (s % P in the loop
   placement); SEND_F of stage s pairs with RECV_F of stage s+1 (on its rank), SEND_B of
   stage s with RECV_B of stage s-1, same micro-batch. Two neighbouring stages on one rank
   exchange nothing (a SEND or RECV between them is refused): the forward of stage s must
   come before that of s+1 on the rank's list, the input side of s+1's backward before s's.
   PL_OK = valid; otherwise PL_EINVAL and err names the rank, the action (with its stage)
   and the reason (PL_ENOMEM: out of memory).

   It also checks the engine's storage contract, so that every schedule it
   accepts computes exactly what one process computes. Every value that
   crosses an action boundary lives in storage owned by its micro-batch from
   its producer to its last reader:
     received activation  RECV_F -> F       recv buffer of mb
     forward output       F -> SEND_F       activation slot of mb (freed by B:
                                            SEND_F must come before B)
     head gradient        F -> B            slot of mb (last stage)
     received gradient    RECV_B -> B       recv buffer of mb
     input gradient       B -> SEND_B       send buffer of mb
     loss                 F -> step end     loss of mb
     output gradients     I -> W            slot of mb (its own set: the stage is
                                            built with deferred weight buffers)
   A micro-batch's backward is either one B, or an I and a later W; wherever a rule
   names B, I takes its place for the input side (receive, send, the forward output
   sent first) and W for the weight side (the slot is freed by B or W).
   The one value shared by micro-batches is a stage's gradient accumulator, and a
   float sum depends on its order: on every stage the weight adders, B or W (and,
   on the last stage, F, which runs the LM head's backward), must come in ascending
   micro-batch order. The
   engine checks the same order as it runs and refuses, naming the action. */
int sched_validate(const sched *s, char *err, size_t errlen);

/* Result of a unit-cost dry run. Per-action arrays are indexed by
   off[r] + i for action i of rank r. */
typedef struct {
    double bubble;   /* 1 - busy / (P * makespan) */
    int makespan;    /* time the last rank finishes */
    int P;
    int *off;        /* P+1 offsets into start/end */
    int *start;      /* start time of every action */
    int *end;        /* end time (start + cost) of every action */
    long busy;       /* total compute time over all ranks */
} sched_sim;

#define SCHED_COST_F 1
#define SCHED_COST_B 2
#define SCHED_COST_I 1
#define SCHED_COST_W 1

/* Play the schedule with F=1, B=2, I=1, W=1 on every stage (a chunk costs what a
   stage costs), communication instantaneous; a RECV completes at the time its
   matching SEND was issued. busy and bubble are over the P ranks. Fails (PL_EINVAL, with
   a message naming each blocked rank) on deadlock or on malformed actions. PL_OK = ok. */
int sched_simulate(const sched *s, sched_sim *out, char *err, size_t errlen);

/* Release a sched_sim; safe on a zeroed one. */
void sched_sim_free(sched_sim *sim);

/* Max number of micro-batches forwarded but whose slot is not yet freed (by B or W) at any point
   on RANK `stage` (the argument is a rank; with V = 1 rank = stage). With V > 1 it counts
   the activations of all the rank's chunks together: the peak over its list of the sum over
   its chunks (at most the sum of their sched_max_inflight_stage). -1 if out of range. */
int sched_max_inflight(const sched *s, int stage);

/* The same for one GLOBAL stage: the peak number of its slots (its micro-batches forwarded,
   not yet freed by B or W). -1 if stage is outside 0..S-1. */
int sched_max_inflight_stage(const sched *s, int stage);

/* 1 if RANK `stage` has a chunk that starts a backward while an earlier micro-batch's W of
   the same chunk is still pending: that chunk then needs deferred weight buffers
   (stage_init_deferred). With V = 1 rank = stage. */
int sched_defers_weights(const sched *s, int stage);

/* The same for one GLOBAL stage (0 if out of range). */
int sched_defers_weights_stage(const sched *s, int stage);

/* Print the rank x time grid of the unit-cost simulation (a B fills two
   columns, '.' is idle) and a summary: name, P, M, bubble, in-flight.
   With V > 1 each cell carries its global stage ("5F3", torch's spelling), and
   per rank the peak in-flight activations (all its chunks) and its own bubble
   follow, with the theory of interleaved-1f1b. */
void sched_print_grid(const sched *s, FILE *out);

#endif /* PIPELM_SCHED_H */
