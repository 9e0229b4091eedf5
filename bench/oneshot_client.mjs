// One-shot runs through the real @agentuity/core client, timed in-process (Node start-up
// is not counted). Prints one JSON line: {"samples_ms": [...], "by_url": {URL: [...]}}.
//   HUTCH_URL=... HUTCH_API_KEY=... node bench/oneshot_client.mjs N RUNTIME CMD...
// HUTCH_URL may name several servers, comma-separated (bench/compare.py): each of the N rounds
// runs once on every one, the order reversed every other round (A B, B A, ...) so that neither
// always runs second; samples_ms then holds the first server's.
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, '..', 'tests', 'compat', 'package.json'));
const { SandboxClient } = await import(require.resolve('@agentuity/core/sandbox'));

const [n, runtime, ...exec] = process.argv.slice(2);
const urls = process.env.HUTCH_URL.split(',');
const clients = urls.map((url) => new SandboxClient({ url, apiKey: process.env.HUTCH_API_KEY }));
const byUrl = Object.fromEntries(urls.map((url) => [url, []]));
for (let i = 0; i < Number(n); i++) {
	const order = i % 2 === 0 ? urls.keys() : [...urls.keys()].reverse();
	for (const k of order) {
		const t0 = performance.now();
		const result = await clients[k].run({ runtime, command: { exec } });
		byUrl[urls[k]].push(performance.now() - t0);
		if (result.exitCode !== 0) throw new Error(`run on ${urls[k]} exited ${result.exitCode}: ${result.stderr}`);
	}
}
console.log(JSON.stringify({ samples_ms: byUrl[urls[0]], by_url: byUrl }));
