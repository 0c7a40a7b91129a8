/*
 * trace.h — a per-rank timeline of the pipeline, written as Chrome trace-event JSON.
 *
 * Each rank records events (name, category, micro-batch, start, end in MPI_Wtime seconds)
 * into memory; trace_write gathers them on rank 0 and writes one file with one track per
 * rank (pid 0, tid = rank), times in microseconds from a common origin taken right after a
 * barrier, so tracks line up across ranks. Opens in Perfetto and chrome://tracing.
 */
#ifndef PIPELM_TRACE_H
#define PIPELM_TRACE_H

#include <mpi.h>

typedef struct trace trace;

/* Collective: start a trace on every rank of comm (a barrier fixes the time origin). */
trace *trace_open(MPI_Comm comm);
/* Record one event; mb < 0 for events without a micro-batch. */
void trace_event(trace *t, const char *name, const char *cat, int mb, double t0, double t1);
/* The same for an event of one global stage (>= 0; written as args.stage): with virtual
 * stages a rank computes several. */
void trace_event_stage(trace *t, const char *name, const char *cat, int mb, int stage, double t0, double t1);
/* Record a counter sample (a Chrome "C" event: name, value) at time `at` (MPI_Wtime seconds);
 * the benchmark's wait split puts each rank's parts on its track this way. */
void trace_counter(trace *t, const char *name, double value, double at);
/* Collective: gather and write the file on rank 0; frees the trace. */
int trace_write(trace *t, const char *path);
/* Local: free the trace without writing it (the error path, where peers may be gone). */
void trace_discard(trace *t);

#endif
