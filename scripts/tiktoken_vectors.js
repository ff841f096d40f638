// Writes the test vectors of tests/test_tiktoken.c with the reference encoder, the npm package
// tiktoken (the WASM build of OpenAI's Rust tiktoken), for cl100k_base, o200k_base and Llama 3
// (Meta's ranks with tiktoken's engine, as Meta's own tokenizer.py runs them):
//   node scripts/tiktoken_vectors.js TIKTOKEN_PKG RANKS_DIR OUT_DIR
// RANKS_DIR: the rank files scripts/setup.sh --tokenizers writes (llm3d's cache, tiktoken/).
// Writes OUT_DIR/tiktoken_NAME.tsv, one case a line: a mode ("o": special tokens' text is text,
// tiktoken's encode_ordinary; "s": special tokens allowed, encode(text, "all")), a tab, the input's
// bytes in hex, a tab, the ids. The corpus (built below, deterministic): each fragment alone, then
// seeded random joins of 2 to 5 fragments, then invalid UTF-8.
// Invalid UTF-8 (the reference takes strings only): llm3d's rule is that each maximal run of bytes
// that are not part of a valid UTF-8 sequence is a pre-token of its own, merged by rank like any
// other, and the valid text around it encodes as it would alone; the expected ids are built so,
// with the reference for the valid parts and the byte-pair merge below for the runs.
const fs = require('fs');
const path = require('path');
const [pkg, ranksDir, outDir] = process.argv.slice(2);
const { Tiktoken } = require(path.join(pkg, 'tiktoken.cjs'));
const CL100K = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const encodings = {
  cl100k_base: JSON.parse(fs.readFileSync(path.join(pkg, 'encoders', 'cl100k_base.json'))),
  o200k_base: JSON.parse(fs.readFileSync(path.join(pkg, 'encoders', 'o200k_base.json'))),
  llama3: { pat_str: CL100K, special_tokens: llama3Special() },
};
function llama3Special() {
  const named = ['<|begin_of_text|>', '<|end_of_text|>', '<|reserved_special_token_0|>', '<|reserved_special_token_1|>',
    '<|finetune_right_pad_id|>', '<|reserved_special_token_2|>', '<|start_header_id|>', '<|end_header_id|>',
    '<|eom_id|>', '<|eot_id|>', '<|python_tag|>'];
  for (let i = 3; i <= 247; i++) named.push(`<|reserved_special_token_${i}|>`);
  return Object.fromEntries(named.map((s, i) => [s, 128000 + i]));
}

const { corpus, invalid, segments } = require('./tokenizer_corpus.js');

function loadRanks(file) {
  const ranks = new Map();
  for (const line of fs.readFileSync(file, 'utf8').split('\n')) {
    if (!line) continue;
    const [b64, r] = line.split(' ');
    ranks.set(Buffer.from(b64, 'base64').toString('latin1'), Number(r));
  }
  return ranks;
}
// tiktoken's byte-pair merge of one piece (bytes as a latin1 string): the whole piece if it is a
// token, else the lowest-ranked adjacent pair merged first, leftmost on a tie
function bytePairEncode(piece, ranks) {
  if (ranks.has(piece)) return [ranks.get(piece)];
  let parts = [...piece];
  for (;;) {
    let best = -1, bestRank = Infinity;
    for (let i = 0; i + 1 < parts.length; i++) {
      const r = ranks.get(parts[i] + parts[i + 1]);
      if (r !== undefined && r < bestRank) { bestRank = r; best = i; }
    }
    if (best < 0) break;
    parts.splice(best, 2, parts[best] + parts[best + 1]);
  }
  return parts.map(p => ranks.get(p));
}
fs.mkdirSync(outDir, { recursive: true });
for (const [name, enc] of Object.entries(encodings)) {
  const ranks = loadRanks(path.join(ranksDir, name + '.tiktoken'));
  const bpe = [...ranks].map(([s, r]) => Buffer.from(s, 'latin1').toString('base64') + ' ' + r).join('\n');
  const tk = new Tiktoken(bpe, enc.special_tokens, enc.pat_str);
  const lines = [];
  for (const s of corpus) {
    const hex = Buffer.from(s, 'utf8').toString('hex');
    lines.push('o\t' + hex + '\t' + Array.from(tk.encode_ordinary(s)).join(' '));
    if (s.includes('<|')) lines.push('s\t' + hex + '\t' + Array.from(tk.encode(s, 'all')).join(' '));
  }
  for (const b of invalid) {
    const ids = [];
    for (const seg of segments(b))
      ids.push(...(seg.valid ? Array.from(tk.encode_ordinary(seg.s)) : bytePairEncode(seg.s, ranks)));
    lines.push('o\t' + b.toString('hex') + '\t' + ids.join(' '));
  }
  tk.free();
  fs.writeFileSync(path.join(outDir, 'tiktoken_' + name + '.tsv'), lines.join('\n') + '\n');
}
