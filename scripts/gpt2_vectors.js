// Writes GPT-2 tokenizer test vectors with the reference JavaScript encoder of the npm package
// gpt-3-encoder (OpenAI's encoder.py ported to JavaScript), for tests/test_tokenizer.c.
//   node scripts/gpt2_vectors.js DIR_OF_UNPACKED_PACKAGE [TEXT_FILE...] > tests/data/gpt2_vectors.tsv
// One case a line: the input's UTF-8 bytes in hex, a tab, the token ids separated by spaces.
// Cases: the strings below, then every non-empty valid UTF-8 line of the text files (446 cases in all).
const path = require('path');
const fs = require('fs');
const { encode } = require(path.resolve(process.argv[2], 'Encoder.js'));
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
