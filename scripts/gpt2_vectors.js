// Writes GPT-2 tokenizer test vectors with the reference JavaScript encoder of the npm package
// gpt-3-encoder (OpenAI's encoder.py ported to JavaScript), for tests/test_tokenizer.c.
//   node scripts/gpt2_vectors.js DIR_OF_UNPACKED_PACKAGE [TEXT_FILE...] > tests/data/gpt2_vectors.tsv
//   node scripts/gpt2_vectors.js DIR_OF_UNPACKED_PACKAGE --unicode > tests/data/gpt2_vectors_unicode.tsv
// --unicode: only strings with letters and digits added in Unicode 15.0 to 17.0 (newer than PCRE2
// 10.42's tables); they need a node whose ICU has them (process.versions.unicode >= 17.0; node
// 20.20.2 with ICU 78.2 wrote the committed file).
// One case a line: the input's UTF-8 bytes in hex, a tab, the token ids separated by spaces.
// Cases: the strings below, then every non-empty valid UTF-8 line of the text files (446 cases in all).
const path = require('path');
const fs = require('fs');
const { encode } = require(path.resolve(process.argv[2], 'Encoder.js'));
const unicode = [
  "\u{11F04}'ll", "\u{31350}'ll", ' \u{11F04}\u{11F05}\u{11F12} Kawi', 'CJK-H \u{31350}\u{31351} I \u{2EBF0}',
  'Nag Mundari \u{1E4D0}\u{1E4D1}\u{1E4EB} \u{1E4F0}\u{1E4F1}', 'Kawi digits \u{11F50}\u{11F51}x',
  'Garay \u{10D4A}\u{10D4B} \u{10D40}\u{10D41}', 'Kirat Rai \u{16D40}\u{16D41} \u{16D70}',
  'Unicode 17 \u{1E6C0}\u{1E6C1} \u{11DB0}', 'outlined digits \u{1CCF0}\u{1CCF1}', 'x\u{11F04}y 1\u{11F50}2',
  'Telugu \u0C5C Kannada \u0CDC Latin \uA7CB\uA7D2 Cyrillic \u1C89',
];
if (process.argv[3] === '--unicode') {
  if (parseFloat(process.versions.unicode) < 17) throw new Error('this node has Unicode ' + process.versions.unicode + ', not 17.0');
  for (const s of unicode)
    process.stdout.write(Buffer.from(s, 'utf-8').toString('hex') + '\t' + encode(s).join(' ') + '\n');
  process.exit(0);
}
const cases = [
  'Hello, world!', 'hello world', ' leading space', 'trailing space ', '',
  "I'm sure they'll say it's fine, we've seen you'd've done 'em", "DON'T SHOUT'S", "y'all 're",
  'café naïve résumé Ångström Zürich façade', 'Ελληνικά και русский язык', 'עברית ערבית العربية',
  '日本語のテキスト、中文文本。한국어 텍스트', '🙂 emoji 🎉🎉 👩‍👩‍👧 flags 🇫🇷🇯🇵', '𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math 𝟙𝟚𝟛',
  '12345 1,000,000 3.14159 ٣٤٥ ½ Ⅻ 2024-12-02', 'x = 007; y=42',
  'a  b   c    d', 'tabs\tand\t\ttabs', 'new\nline\n\n\nruns\r\n', '   ', '\n\n', ' \t \n ',
  'trailing runs   \n   ', 'nbsp\u00a0here\u00a0\u00a0there', 'ideographic\u3000space',
  'int main(void) { return printf("%d\\n", x[i++] >> 2); }',
  'def f(x):\n    return {"k": [1, 2]}  # comment\n', '<|endoftext|> is text here',
  '!!!??? ... --- ___ *** ### @@@ $$$', 'http://example.com/path?q=1&r=2#frag', 'aaaaaaaaaaaaaaaaaaaa',
  'The quick brown fox jumps over the lazy dog.', 'supercalifragilisticexpialidocious',
  'mixedCASEWordsAndNumbers123abc', 'ﬁ ligature ﬀ and combining e\u0301 and Å',
];
// long pre-tokens (the encoder merges those through a heap): pseudo-random letters, runs
let seed = 12345, letters = '';
for (let i = 0; i < 1200; i++) { seed = (seed * 1103515245 + 12345) % 2147483648; letters += 'etaoinshrdlucmfw'[(seed >> 16) % 16]; }
cases.push(letters, ' ' + letters.slice(0, 700) + ' tail', '='.repeat(600), 'ab'.repeat(400),
           '1234567890'.repeat(70), ' '.repeat(500) + 'word');
for (const f of process.argv.slice(3)) {
  for (const line of fs.readFileSync(f).toString('latin1').split('\n')) {
    const buf = Buffer.from(line, 'latin1');
    let s;
    try { s = new TextDecoder('utf-8', { fatal: true }).decode(buf); } catch (e) { continue; }
    if (s.length > 0 && cases.length < 446) cases.push(s + '\n');
  }
}
for (const s of cases)
  process.stdout.write(Buffer.from(s, 'utf-8').toString('hex') + '\t' + encode(s).join(' ') + '\n');
