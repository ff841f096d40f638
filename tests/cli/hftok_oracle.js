// The npm Hugging Face tokenizers (@huggingface/tokenizers, tokenizers.js: the pure JavaScript
// tokenizer of transformers.js, which scripts/setup.sh --tokenizers unpacks) on a tokenizer.json
// that llm3d wrote (tests/cli/hftok.sh):
//   node hftok_oracle.js PKG DIR OUT.tsv
// encodes the held-out texts of the tokenizer tests (scripts/tokenizer_corpus.js: every string of
// its corpus) with DIR/tokenizer.json and DIR/tokenizer_config.json, writes OUT.tsv in
// tests/data/tiktoken_NAME.tsv's format (o: the added tokens removed, their text is text, as
// llm3d's `tokenizer encode`; s, for texts that spell one: with them), and checks that decoding
// gives each text back; prints the case count and the ids of "Hello" with the special tokens the
// post-processor adds (begin-of-text for Llama 3).
//   node hftok_oracle.js --same A.json B.json
// exits 0 when the two tokenizer.json files have the same vocabulary and merges (["a", "b"] and
// "a b" alike), else 1, saying where they differ.
const fs = require('fs');
const path = require('path');

if (process.argv[2] === '--same') {
  const model = f => JSON.parse(fs.readFileSync(f)).model;
  const [a, b] = process.argv.slice(3).map(model);
  const merges = m => m.merges.map(x => (Array.isArray(x) ? x.join(' ') : x));
  const va = Object.entries(a.vocab), vb = b.vocab;
  const vocabDiff = va.length !== Object.keys(vb).length ? 'sizes' : va.find(([k, v]) => vb[k] !== v);
  const ma = merges(a), mb = merges(b);
  const at = ma.length !== mb.length ? -1 : ma.findIndex((m, i) => m !== mb[i]);
  console.log(`vocab: ${va.length} and ${Object.keys(vb).length} tokens${vocabDiff ? ', differ at ' + vocabDiff : ', the same'}; ` +
              `merges: ${ma.length} and ${mb.length}${at === -1 && ma.length === mb.length ? ', the same' : ', differ at ' + at}`);
  process.exit(!vocabDiff && ma.length === mb.length && at === -1 ? 0 : 1);
}

const [pkg, dir, out] = process.argv.slice(2);
const { Tokenizer } = require(path.join(pkg, 'dist', 'tokenizers.cjs'));
const { corpus } = require(path.join(__dirname, '..', '..', 'scripts', 'tokenizer_corpus.js'));
const json = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json')));
const config = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json')));
const full = new Tokenizer(json, config);
const plain = new Tokenizer({ ...json, added_tokens: [] }, config);
const ids = (tk, s) => tk.encode(s, { add_special_tokens: false }).ids;
const lines = [];
let undecoded = 0;
for (const s of corpus) {
  const hex = Buffer.from(s, 'utf8').toString('hex'), o = ids(plain, s);
  lines.push('o\t' + hex + '\t' + o.join(' '));
  if (s.includes('<|')) lines.push('s\t' + hex + '\t' + ids(full, s).join(' '));
  if (plain.decode(o, { skip_special_tokens: false, clean_up_tokenization_spaces: false }) !== s) undecoded++;
}
fs.writeFileSync(out, lines.join('\n') + '\n');
const hello = full.encode('Hello', { add_special_tokens: true }).ids;
console.log(`${lines.length} cases; ${undecoded} not decoded back; "Hello" with special tokens: ${hello.join(' ')}`);
