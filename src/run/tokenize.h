/*
 * tokenize.h — `pipelm tokenize`: text, JSON-lines and gzip corpora encoded with a BPE
 * tokenizer (formats/bpe.h) into llm.c token shards, split over the ranks by byte ranges,
 * the same bytes on any number of ranks (tokenize.c says how).
 */
#ifndef PIPELM_TOKENIZE_H
#define PIPELM_TOKENIZE_H

#include <mpi.h>

/* `pipelm tokenize ...` on comm: the exit status (0; 1 a file that cannot be read or written; 2 a
 * bad option, tokenizer or refused input line). */
int tokenize_main(int argc, char **argv, MPI_Comm comm);

#endif
