// One-shot runs a second through the real @agentuity/core client: CONCURRENCY loops of
// SandboxClient.run() for SECONDS against one server, timed in-process (Node start-up is not
// counted). Prints one JSON line: {"rate": runs per second, "runs": N}.
//   HUTCH_URL=... HUTCH_API_KEY=... node bench/client_rate.mjs CONCURRENCY SECONDS RUNTIME CMD...
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, '..', 'tests', 'compat', 'package.json'));
const { SandboxClient } = await import(require.resolve('@agentuity/core/sandbox'));

const [concurrency, seconds, runtime, ...exec] = process.argv.slice(2);
const client = new SandboxClient({ url: process.env.HUTCH_URL, apiKey: process.env.HUTCH_API_KEY });
await client.run({ runtime, command: { exec } }); // warm: not counted
const t0 = performance.now();
const deadline = t0 + Number(seconds) * 1000;
let runs = 0;
async function loop() {
	while (performance.now() < deadline) {
		const result = await client.run({ runtime, command: { exec } });
		if (result.exitCode !== 0) throw new Error(`run exited ${result.exitCode}: ${result.stderr}`);
		runs++;
	}
}
await Promise.all(Array.from({ length: Number(concurrency) }, loop));
console.log(JSON.stringify({ rate: (runs * 1000) / (performance.now() - t0), runs }));
