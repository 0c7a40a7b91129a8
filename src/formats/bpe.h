/*
 * bpe.h — byte-level BPE: encoding text to token ids and decoding them back, for GPT-2, Llama 3
 * and cl100k / o200k style vocabularies.
 *
 * Two kinds of file load into the same tables:
 *   a Hugging Face tokenizer.json: model "BPE" (vocab, merges as "a b" strings or [a, b]
 *       pairs, ignore_merges), the pre-tokenizer ByteLevel (with its GPT-2 regex) or a
 *       Sequence of Split (a regex, behaviour Isolated) and ByteLevel without its regex, the
 *       ByteLevel decoder, added tokens (special or not). Other normalizers, pre-tokenizers,
 *       models or options (add_prefix_space, a continuing-subword prefix, byte fallback,
 *       dropout) are refused by name: the ids would not be the file's.
 *   a tiktoken rank file (OpenAI's .tiktoken, Meta's original/tokenizer.model): one
 *       "base64-bytes rank" a line; the pre-tokenizer pattern and the special tokens come from
 *       a named preset (gpt2, cl100k, llama3, o200k), chosen by name or by the rank count.
 * Every token is kept as its raw bytes (the ByteLevel alphabet is undone at load), so
 * decoding is concatenation and decode(encode(x)) == x for any bytes.
 *
 * Encoding: special tokens are split out first where allowed (non-special added tokens
 * always), the rest is cut into pieces by the pre-tokenizer regex (PCRE2, Unicode
 * properties, JIT; bytes that are not UTF-8 never match and are encoded as pieces of their
 * own, as bytes), and each piece is merged by rank with a binary heap (lowest rank first,
 * leftmost on ties; O(L log L) for a piece of L bytes), the same rule as tiktoken's and
 * Hugging Face's. With ignore_merges (tiktoken files always, tokenizer.json when it says so) a
 * piece that is a token is that token.
 */
#ifndef PIPELM_BPE_H
#define PIPELM_BPE_H

#include <stddef.h>
#include <stdint.h>

typedef struct bpe bpe;

/* A growing list of token ids. */
typedef struct {
    int *v;                /* (n) ids */
    size_t n, cap;
} bpe_ids;

/* Load a tokenizer.json or a tiktoken rank file (told apart by content). pattern: a preset
 * name for a rank file (NULL or "": by the rank count); ignored for tokenizer.json. PL_EIO /
 * PL_EINVAL with "tokenizer PATH: cause" in err. */
int bpe_load(bpe **out, const char *path, const char *pattern, char *err, size_t errlen);
/* The same from the file's bytes already read (text[size] must be writable: a NUL goes there);
 * path only names it in messages. */
int bpe_load_mem(bpe **out, const char *path, char *text, size_t size, const char *pattern, char *err,
                 size_t errlen);
void bpe_free(bpe *b);

/* Append the ids of text[0..n) to out. allow_special: special tokens in the text are
 * encoded as themselves (else as ordinary text, as tiktoken's encode_ordinary). PL_ENOMEM. */
int bpe_encode(bpe *b, const char *text, size_t n, int allow_special, bpe_ids *out);
void bpe_ids_free(bpe_ids *ids);

/* The vocabulary size: every id is below it. */
int bpe_vocab(const bpe *b);
/* Token id's bytes (NULL, *len 0 for an id outside the table or a hole in it). */
const char *bpe_token(const bpe *b, int id, size_t *len);
/* The id of a token given as its text (special or ordinary), or -1. */
int bpe_find(const bpe *b, const char *text);
/* The document token (prefixed to every document in shards: <|endoftext|> for GPT-2,
 * <|begin_of_text|> for Llama 3) and the end token (generation stops there), or -1. */
int bpe_doc_token(const bpe *b);
int bpe_end_token(const bpe *b);
/* How the file was read, for messages: "tokenizer.json (ByteLevel regex gpt2)". */
const char *bpe_desc(const bpe *b);

#endif
