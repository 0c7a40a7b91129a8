// bpe_tiktoken.js — the independent encoder of the full tier's tokenizer checks: OpenAI's
// tiktoken (its Rust core compiled to WebAssembly, npm package "tiktoken") with the
// vocabularies npm packages ship: GPT-2's ranks (tiktoken's own encoders/gpt2.json) and
// Llama 3's vocabulary and merges (npm package "llama3-tokenizer-js"). Nothing here comes from
// pipelm's code.
//
//   node bpe_tiktoken.js files MODULES OUTDIR
//       writes gpt2.tiktoken, gpt2.json (a Hugging Face tokenizer.json made from the ranks),
//       llama3.tiktoken and llama3.json (Llama 3's tokenizer.json: its vocab, merges, specials)
//   node bpe_tiktoken.js encode MODULES gpt2|llama3 OUT.bin FILE...
//       one llm.c shard: per FILE (a document, UTF-8), the document token then tiktoken's
//       encode_ordinary of its text (uint16 for GPT-2, uint32 for Llama 3)
//   node bpe_tiktoken.js bench MODULES gpt2|llama3 FILE
//       encode_ordinary's throughput on FILE, one thread: "bench MB tokens wall-seconds cpu-seconds"
// MODULES is the node_modules directory holding both packages.
'use strict';
const fs = require('fs');
const path = require('path');

const LLAMA3_PAT = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// GPT-2's bytes_to_unicode, from its definition
function byteLevel() {
  const bs = [];
  for (let b = 33; b <= 126; b++) bs.push(b);
  for (let b = 161; b <= 172; b++) bs.push(b);
  for (let b = 174; b <= 255; b++) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; b++) if (!bs.includes(b)) { bs.push(b); cs.push(256 + n++); }
  const enc = new Array(256), dec = new Map();
  bs.forEach((b, i) => { enc[b] = String.fromCodePoint(cs[i]); dec.set(String.fromCodePoint(cs[i]), b); });
  return { enc, dec };
}
const BL = byteLevel();
const toBL = (buf) => Array.from(buf, (b) => BL.enc[b]).join('');
const fromBL = (s) => Buffer.from(Array.from(s, (c) => { const b = BL.dec.get(c); if (b === undefined) throw new Error('not ByteLevel: ' + s); return b; }));

// tiktoken's compressed ranks ("x OFFSET b64 b64 ..." lines) to an array of Buffers by rank
function gpt2Ranks(mods) {
  const j = JSON.parse(fs.readFileSync(path.join(mods, 'tiktoken/encoders/gpt2.json'), 'utf8'));
  const ranks = [];
  for (const line of j.bpe_ranks.split('\n')) {
    if (!line) continue;
    const [, off, ...toks] = line.split(' ');
    toks.forEach((t, i) => { ranks[Number(off) + i] = Buffer.from(t, 'base64'); });
  }
  return { ranks, pat: j.pat_str, special: j.special_tokens };
}

function llama3(mods) {
  const { llama3Tokenizer: t } = require(path.join(mods, 'llama3-tokenizer-js/bundle/commonjs-llama3-tokenizer-with-baked-data.cjs'));
  const ranks = t.vocabById.slice(0, 128000).map(fromBL);
  const special = {};
  t.vocabById.slice(128000).forEach((s, i) => { special[s] = 128000 + i; });
  const merges = Array.from(t.merges.entries()).sort((a, b) => a[1] - b[1]).map((e) => e[0]);
  return { ranks, pat: LLAMA3_PAT, special, merges };
}

// the merge that makes each token, found as tiktoken's converters do: BPE of its bytes with
// the ranks below its own, which leaves two parts
function mergesFromRanks(ranks) {
  const rankOf = new Map(ranks.map((b, i) => [b.toString('latin1'), i]));
  const merges = [];
  ranks.forEach((tok, r) => {
    if (tok.length < 2) return;
    let parts = Array.from(tok, (b) => Buffer.from([b]));
    for (;;) {
      let best = -1, bestRank = r;
      for (let i = 0; i + 1 < parts.length; i++) {
        const k = rankOf.get(Buffer.concat([parts[i], parts[i + 1]]).toString('latin1'));
        if (k !== undefined && k < bestRank) { best = i; bestRank = k; }
      }
      if (best < 0) break;
      parts.splice(best, 2, Buffer.concat([parts[best], parts[best + 1]]));
    }
    if (parts.length !== 2) throw new Error('token ' + r + ' does not split in two');
    merges.push(toBL(parts[0]) + ' ' + toBL(parts[1]));
  });
  return merges;
}

function tokenizerJson(v, preTokenizer) {
  const vocab = {};
  v.ranks.forEach((b, i) => { vocab[toBL(b)] = i; });
  const added = Object.entries(v.special).map(([content, id]) => ({ id, content, single_word: false, lstrip: false,
    rstrip: false, normalized: false, special: true }));
  return JSON.stringify({ version: '1.0', truncation: null, padding: null, added_tokens: added, normalizer: null,
    pre_tokenizer: preTokenizer, post_processor: null,
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: '', end_of_word_suffix: '',
      fuse_unk: false, byte_fallback: false, ignore_merges: v.ignoreMerges, vocab, merges: v.merges } });
}

const rankFile = (ranks) => ranks.map((b, i) => b.toString('base64') + ' ' + i).join('\n') + '\n';

function files(mods, out) {
  const g = gpt2Ranks(mods);
  g.merges = mergesFromRanks(g.ranks);
  g.ignoreMerges = false;
  fs.writeFileSync(path.join(out, 'gpt2.tiktoken'), rankFile(g.ranks));
  fs.writeFileSync(path.join(out, 'gpt2.json'), tokenizerJson(g, { type: 'ByteLevel', add_prefix_space: false,
    trim_offsets: true, use_regex: true }));
  const l = llama3(mods);
  l.ignoreMerges = true;
  fs.writeFileSync(path.join(out, 'llama3.tiktoken'), rankFile(l.ranks));
  fs.writeFileSync(path.join(out, 'llama3.json'), tokenizerJson(l, { type: 'Sequence', pretokenizers: [
    { type: 'Split', pattern: { Regex: LLAMA3_PAT }, behavior: 'Isolated', invert: false },
    { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false }] }));
}

function encoder(mods, which) {
  const { Tiktoken } = require(path.join(mods, 'tiktoken/lite/tiktoken.cjs'));
  const v = which === 'gpt2' ? gpt2Ranks(mods) : llama3(mods);
  const line = '! 0 ' + v.ranks.map((b) => b.toString('base64')).join(' ');
  const enc = new Tiktoken(line, v.special, v.pat);
  const doc = which === 'gpt2' ? v.special['<|endoftext|>'] : v.special['<|begin_of_text|>'];
  return { enc, doc, tb: which === 'gpt2' ? 2 : 4 };
}

function encode(mods, which, out, inputs) {
  const { enc, doc, tb } = encoder(mods, which);
  const toks = [];
  for (const f of inputs) {
    toks.push(doc);
    for (const t of enc.encode_ordinary(fs.readFileSync(f, 'utf8'))) toks.push(t);
  }
  const buf = Buffer.alloc(1024 + toks.length * tb);
  buf.writeInt32LE(tb === 2 ? 20240520 : 20240801, 0);
  buf.writeInt32LE(tb === 2 ? 1 : 7, 4);
  buf.writeInt32LE(toks.length, 8);
  toks.forEach((t, i) => { if (tb === 2) buf.writeUInt16LE(t, 1024 + 2 * i); else buf.writeUInt32LE(t, 1024 + 4 * i); });
  fs.writeFileSync(out, buf);
}

function bench(mods, which, file) {
  const { enc } = encoder(mods, which);
  const text = fs.readFileSync(file, 'utf8');
  enc.encode_ordinary(text.slice(0, 100000)); // warm
  const t0 = process.hrtime.bigint(), c0 = process.cpuUsage();
  const n = enc.encode_ordinary(text).length;
  const s = Number(process.hrtime.bigint() - t0) / 1e9, c = process.cpuUsage(c0);
  console.log(`bench ${(Buffer.byteLength(text) / 1e6).toFixed(3)} MB ${n} tokens ${s.toFixed(3)} s wall ` +
              `${((c.user + c.system) / 1e6).toFixed(3)} s cpu`);
}

const [cmd, mods, ...rest] = process.argv.slice(2);
if (cmd === 'files') files(mods, rest[0]);
else if (cmd === 'encode') encode(mods, rest[0], rest[1], rest.slice(2));
else if (cmd === 'bench') bench(mods, rest[0], rest[1]);
else { console.error('usage: see the header of bpe_tiktoken.js'); process.exit(2); }
