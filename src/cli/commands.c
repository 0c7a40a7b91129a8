/*
 * commands.c — the subcommand table (commands.h) and the thin adapters that give each
 * module's entry point the table's signature.
 */
#include <string.h>
#include "cli/commands.h"
#include "ckpt/ckpt.h"
#include "pipeline/tune.h"
#include "run/eval.h"
#include "run/generate.h"
#include "run/tokenize.h"

static int tune_cmd_main(int argc, char **argv, MPI_Comm comm, int *abort_needed) {
    *abort_needed = 0;
    return tune_main(argc, argv, 2, comm);
}

/* convert and inspect run on rank 0; the other ranks have nothing to do */
static int convert_cmd_main(int argc, char **argv, MPI_Comm comm, int *abort_needed) {
    int rank;
    MPI_Comm_rank(comm, &rank);
    *abort_needed = 0;
    return rank == 0 ? ckpt_convert_main(argc, argv, 2) : 0;
}

static int inspect_cmd_main(int argc, char **argv, MPI_Comm comm, int *abort_needed) {
    int rank;
    MPI_Comm_rank(comm, &rank);
    *abort_needed = 0;
    return rank == 0 ? ckpt_inspect_main(argc, argv, 2) : 0;
}

static int tokenize_cmd_main(int argc, char **argv, MPI_Comm comm, int *abort_needed) {
    *abort_needed = 0;
    return tokenize_main(argc, argv, comm);
}

static int generate_cmd_main(int argc, char **argv, MPI_Comm comm, int *abort_needed) {
    return generate_main(argc, argv, comm, 0, abort_needed);
}

const pl_command pl_commands[] = {
    {"train", train_cmd_main, "train a GPT-2 or Llama 3 model, one pipeline stage per MPI rank"},
    {"eval", eval_main, "the loss and perplexity of a model file or checkpoint on a data set, pipelined"},
    {"generate", generate_cmd_main, "sample from a model through the pipeline stages, with a KV cache per stage"},
    {"tokenize", tokenize_cmd_main, "text or JSON-lines corpora to llm.c token shards with a BPE tokenizer, over R ranks"},
    {"schedule", schedule_main, "print a pipeline schedule as a grid (and write torch CSV)"},
    {"bench", bench_cmd_main, "measure performance (--peak: sgemm GFLOP/s; --generate: decoding)"},
    {"tune", tune_cmd_main, "the fastest schedule x micro-batches x chunks for measured costs (bench --costs-out)"},
    {"convert", convert_cmd_main, "llm.c model file / Hugging Face directory <-> pipelm HDF5 checkpoint"},
    {"inspect", inspect_cmd_main, "print a checkpoint's metadata and tensors, verify every checksum"},
    {NULL, NULL, NULL},
};

const pl_command *pl_command_find(const char *name) {
    for (const pl_command *c = pl_commands; c->name; c++)
        if (strcmp(c->name, name) == 0) return c;
    return NULL;
}
