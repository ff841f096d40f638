// The npm reference encoders on the text l3d_bench_tokenizer reads (make bench-text): MB/s of
// encode_ordinary with `tiktoken` (WASM build of OpenAI's Rust tiktoken) and `js-tiktoken` (pure
// JavaScript), one thread each (node runs them on one), best of 3, for cl100k_base and llama3, by
// wall time and by CPU time.
//   node bench/tokenizer_npm.js NODE_MODULES RANKS_DIR FILE...
// RANKS_DIR: the rank files of scripts/setup.sh --tokenizers (llama3's ranks given to both as a
// custom encoding, with cl100k_base's pattern, which Llama 3 shares).
const fs = require('fs');
const path = require('path');
const [modsArg, ranksDir, ...files] = process.argv.slice(2);
const mods = path.resolve(modsArg);
const wasm = require(path.join(mods, 'tiktoken'));
const js = require(path.join(mods, 'js-tiktoken'));
const text = Buffer.concat(files.map(f => fs.readFileSync(f))).toString('utf8');
const mb = Buffer.byteLength(text) / 1e6;
const cl100k = JSON.parse(fs.readFileSync(path.join(mods, 'tiktoken', 'encoders', 'cl100k_base.json')));
const llamaBpe = fs.readFileSync(path.join(ranksDir, 'llama3.tiktoken'), 'utf8');
// js-tiktoken's own cl100k_base (its pattern spells (?i:...) out: JavaScript has no inline flags)
const jsCl100k = require(path.join(mods, 'js-tiktoken', 'dist', 'ranks', 'cl100k_base.cjs'));
const jsRanks = jsCl100k.default || jsCl100k;
const llama = { pat_str: jsRanks.pat_str, special_tokens: { '<|begin_of_text|>': 128000, '<|end_of_text|>': 128001 },
  bpe_ranks: 'x 0 ' + llamaBpe.split('\n').filter(Boolean).map(l => l.split(' ')[0]).join(' ') };
// best of 3 by wall time, with that run's CPU time (process.cpuUsage: the process's threads, so
// V8's helper threads too) for a figure on a shared machine where the wall time waits for a core
function best(f) {
  let b = Infinity, cpu = 0, n = 0;
  for (let r = 0; r < 3; r++) {
    const t0 = process.hrtime.bigint(), c0 = process.cpuUsage();
    n = f().length;
    const dt = Number(process.hrtime.bigint() - t0) / 1e9, c = process.cpuUsage(c0);
    if (dt < b) { b = dt; cpu = (c.user + c.system) / 1e6; }
  }
  return [mb / b, n, mb / cpu];
}
for (const [name, ranks, bpe] of [['cl100k_base', jsRanks, null], ['llama3', llama, llamaBpe]]) {
  const w = bpe ? new wasm.Tiktoken(bpe, ranks.special_tokens, cl100k.pat_str) : wasm.get_encoding(name);
  const [wr, wn, wc] = best(() => w.encode_ordinary(text));
  w.free();
  const j = new js.Tiktoken(ranks);
  const [jr, jn, jc] = best(() => j.encode(text, [], []));
  console.log(`  ${name}: npm tiktoken (WASM) ${wr.toFixed(1)} MB/s (${wc.toFixed(1)} MB/s of CPU time; ${wn} tokens), ` +
    `js-tiktoken ${jr.toFixed(1)} MB/s (${jc.toFixed(1)} of CPU time; ${jn} tokens), 1 thread, ${mb.toFixed(2)} MB`);
}
