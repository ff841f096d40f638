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

const frags = [
  // scripts the patterns treat alike or apart (letters, marks, upper/lower/title case, no case)
  'Hello', 'world', 'HELLO', 'WoRLD', 'camelCaseWord', 'XMLHttpRequest', 'ǅemal', 'ǈubav', 'ʰʲ modifier',
  'café', 'naïve', 'Ångström', 'façade', 'Straße', 'ÆØÅ', 'İstanbul', 'ıi', 'Ελληνικά', 'ΑΘΗΝΑ', 'русский', 'МОСКВА',
  'Հայերեն', 'עברית', 'שָׁלוֹם', 'العربية', 'مَرْحَبًا', 'हिन्दी', 'नमस्ते', 'বাংলা', 'தமிழ்', 'ไทย', 'ภาษาไทย',
  'ქართული', '한국어', '안녕하세요', 'ひらがな', 'カタカナ', '日本語', '中文文本', '漢字', 'ኢትዮጵያ', 'ᏣᎳᎩ', 'ᠮᠣᠩᠭᠣᠯ',
  'བོད་ཡིག', 'e\u0301', 'a\u0308\u0301', 'n\u0303o', '\u0301lone mark', 'ﬁ ﬀ ligatures', '𝔘𝔫𝔦𝔠𝔬𝔡𝔢', '𝐁𝐨𝐥𝐝',
  'Ｆｕｌｌｗｉｄｔｈ', 'ᚠᚢᚦ', 'ꦗꦮ', 'ᜆᜄᜎᜓᜄ',
  // numbers of 1 to 5 digits and other number characters
  '7', '42', '123', '2024', '12345', '1234567', '3.14159', '1,000,000', '0x1F', '007', '٣٤٥', '١٢٣٤',
  '１２３', '²³', 'Ⅻ', '½', '४२', '๑๒๓', '2024-12-02', 'v1.2.3', '$19.99',
  // contractions, both cases
  "I'm", "you're", "we've", "he'll", "she'd", "it's", "don't", "I'M", "YOU'RE", "WE'VE", "HE'LL", "SHE'D",
  "IT'S", "DON'T", "It'S", "We'Ve", "'s", "'S", "'ll", "'LL", "y'all", "rock'n'roll", "o'clock",
  // white space runs
  ' ', '  ', '   ', '\t', '\t\t', '\n', '\n\n', '\n\n\n', '\r\n', '\r\n\r\n', ' \n ', '  \n', '\n  ',
  '\u00a0', '\u3000', '\u2003', ' \t \n', '    indented', 'trail   ',
  // punctuation, code, paths
  '!!!', '???', '...', '—', '«quote»', '“curly”', '(paren)', '[1]', '{"k": [1, 2]}', 'a/b/c', 'http://x.org/a?b=1',
  'C:\\path\\file', '#include <stdio.h>', 'x += 1;', '->', '=>', '::', '</div>', '@user', '#tag', '100%',
  'e-mail', 'snake_case', '__init__', '/**/', '//\n', '/\n/',
  // emoji, ZWJ sequences, flags, skin tones, variation selectors
  '🙂', '🎉🎉', '👩‍👩‍👧', '👨🏽‍💻', '🏳️‍🌈', '❤️', '🇫🇷🇯🇵', '✅', '1️⃣', '☕',
  // special tokens' text inside user text
  '<|endoftext|>', '<|begin_of_text|>', '<|end_of_text|>', '<|eot_id|>', '<|start_header_id|>',
  '<|fim_prefix|>', '<|endofprompt|>', '<|reserved_special_token_5|>', '<|not_special|>', '<|',
];
const seps = ['', ' ', ' ', '\n', '  ', '\t', ', ', '\n\n', ' - '];
let seed = 20240801;
function rnd(n) { seed = (seed * 1103515245 + 12345) % 2147483648; return (seed >> 8) % n; }
const corpus = frags.slice();
while (corpus.length < 2200) {
  const k = 2 + rnd(4);
  let s = frags[rnd(frags.length)];
  for (let i = 1; i < k; i++) s += seps[rnd(seps.length)] + frags[rnd(frags.length)];
  corpus.push(s);
}
// invalid UTF-8: lone continuation bytes, truncated sequences, overlong forms, surrogates, 0xFF
const bad = ['80', 'ff', 'c0 80', 'e2 82', 'f0 9f 98', 'ed a0 80', 'fe ff', '80 80 80', 'c3', 'f4 90 80 80'];
const invalid = [];
for (let i = 0; i < 60; i++) {
  const a = Buffer.from(frags[rnd(frags.length)]), b = Buffer.from(frags[rnd(frags.length)]);
  const mid = Buffer.from(bad[i % bad.length].split(' ').map(h => parseInt(h, 16)));
  invalid.push(Buffer.concat(i % 3 === 0 ? [mid, a] : i % 3 === 1 ? [a, mid] : [a, mid, b]));
}

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
// splits bytes into [valid UTF-8 string | invalid byte run (latin1 string)] segments
function segments(buf) {
  const out = [];
  let i = 0, validStart = 0;
  const dec = new TextDecoder('utf-8', { fatal: true });
  function seqLen(j) {
    for (const n of [1, 2, 3, 4]) {
      if (j + n > buf.length) break;
      try { if ([...dec.decode(buf.subarray(j, j + n))].length === 1) return n; } catch (e) { }
    }
    return 0;
  }
  while (i < buf.length) {
    if (seqLen(i)) { i += seqLen(i); continue; }
    if (i > validStart) out.push({ valid: true, s: buf.subarray(validStart, i).toString('utf8') });
    let j = i;
    while (j < buf.length && !seqLen(j)) j++;
    out.push({ valid: false, s: buf.subarray(i, j).toString('latin1') });
    i = validStart = j;
  }
  if (buf.length > validStart) out.push({ valid: true, s: buf.subarray(validStart).toString('utf8') });
  return out;
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
