/*
 * generate.h — `pipelm generate`: text (token ids) from a model on the same pipeline stages
 * and ranks as training (--chunks-per-rank included), with a KV cache per stage
 * (kvcache.h). Prompts are spread over G groups (micro-batches) that flow through the
 * stages one after another, so while stage 1 computes one group's token, stage 0 computes
 * the next group's; long prompts are prefilled in chunks. Rank 0 drives: it sends each
 * group's next step (a header naming its row segments, and the tokens) into stage 0; every
 * stage computes its blocks and passes the activations on; the last stage samples (greedy at
 * temperature 0; else temperature, top-k, top-p with a stream per sequence and position,
 * so the draws do not depend on P or G) and sends the new tokens back to rank 0. With V
 * chunks per rank, a rank's chunk c runs item k - c lag in its round k (lag = ceil(P / V)), and
 * rank 0 sends an empty item when every group waits for an answer of a later round. A sequence
 * ends at --max-new-tokens, at the end-of-text id, or at the model's max_seq_len. A stop
 * signal ends the run after the steps in flight, every rank together (exit 75).
 */
#ifndef PIPELM_GENERATE_H
#define PIPELM_GENERATE_H

#include <mpi.h>
#include "cli/config.h"

/* The options of generate (beyond the common table). */
typedef struct gen_opts {
    int nprompts;
    int **prompt, *plen;        /* the prompts' token ids */
    int max_new, top_k, groups, chunk, kv_cache, eot;
    double temperature, top_p;
    char tokens_out[PL_PATH], logits_out[PL_PATH], tokenizer[PL_PATH], bench_json[PL_PATH];
    char prompt_file[PL_PATH];  /* --prompt-file (an input: no output may be it) */
    int bench;                  /* pipelm bench --generate: report the figures, print no text */
} gen_opts;

/* `pipelm generate ...` (bench != 0: `pipelm bench --generate ...`) on comm: the exit status;
 * *abort_needed as pipelm_main's. */
int generate_main(int argc, char **argv, MPI_Comm comm, int bench, int *abort_needed);

#endif
