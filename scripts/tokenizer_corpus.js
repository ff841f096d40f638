// The test corpus of the tokenizer oracles (scripts/tiktoken_vectors.js, scripts/hf_vectors.js),
// deterministic: each fragment alone, then seeded random joins of 2 to 5 fragments (corpus), and
// strings with invalid UTF-8 (invalid, Buffers); segments() cuts bytes into valid UTF-8 strings
// and runs of invalid bytes (latin1 strings), by which the oracles build the expected ids of the
// invalid ones: the reference encodes each valid part alone, each invalid run is a pre-token.
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

module.exports = { frags, corpus, invalid, segments };
