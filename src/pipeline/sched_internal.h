/*
 * sched_internal.h — what the parts of the schedule module share (sched.c and its
 * sched_*.c files): error formatting, the op tables, the shell a generator fills, the push
 * helpers that add an action with its messages, and the generators the registry calls.
 * Not for use outside src/pipeline/sched*.c.
 */
#ifndef PIPELM_SCHED_INTERNAL_H
#define PIPELM_SCHED_INTERNAL_H

#include <stddef.h>
#include "pipeline/sched.h"

/* printf into (or onto the end of) the caller's error buffer, which may be NULL */
void sched_err(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void sched_err_append(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* an action for messages; never fails (falls back to "?") */
const char *sched_act_str(const sched_action *a, char *buf, size_t len);
/* the spelling torch uses for each op, indexed by sched_op */
extern const char *const sched_op_names[SCHED_NOPS];
int sched_op_computes(sched_op op);     /* F, B, I and W compute; the rest move data */
int sched_op_known(int op);             /* one of the known kinds */
int sched_op_cost(sched_op op);         /* its unit-cost time */
int sched_peer_stage(const sched_action *a);  /* the stage a message goes to or comes from; -1 */
sched_op sched_partner_op(sched_op op); /* the op on the peer that pairs with a message op */
int sched_nchunks(const sched *s);      /* V, with 0 read as 1 */
/* 1 if stages a and a + 1 run on one rank of a V placement (handed over in memory) */
int sched_local_edge(const sched *s, int a);
/* append one action of global stage st to its rank (capacity sized by the caller); the
   forward / backward / input-gradient of mb with their receive and send where needed */
void sched_push(sched *s, int st, sched_op op, int mb);
void sched_push_fwd(sched *s, int st, int mb);
void sched_push_bwd(sched *s, int st, int mb);
void sched_push_bwd_input(sched *s, int st, int mb);

/* the generators (sched_gen.c, sched_vshape.c) the registry's rows call */
int sched_interleave_group(int P, int M);
void sched_gen_gpipe(sched *s);
void sched_gen_1f1b(sched *s);
int sched_gen_zbh1(sched *s);
void sched_gen_interleaved(sched *s, int G);
void sched_gen_looped_bfs(sched *s);
int sched_gen_interleaved_zb(sched *s, int G);
int sched_gen_vshape(sched *s, int dual);

#endif
