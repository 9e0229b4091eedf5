// One-shot runs through the real @agentuity/core client, timed in-process (Node start-up
// is not counted). Prints one JSON line: {"samples_ms": [...]}.
//   HUTCH_URL=... HUTCH_API_KEY=... node bench/oneshot_client.mjs N RUNTIME CMD...
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, '..', 'tests', 'compat', 'package.json'));
const { SandboxClient } = await import(require.resolve('@agentuity/core/sandbox'));

const [n, runtime, ...exec] = process.argv.slice(2);
const client = new SandboxClient({ url: process.env.HUTCH_URL, apiKey: process.env.HUTCH_API_KEY });
const samples = [];
for (let i = 0; i < Number(n); i++) {
	const t0 = performance.now();
	const result = await client.run({ runtime, command: { exec } });
	samples.push(performance.now() - t0);
	if (result.exitCode !== 0) throw new Error(`run exited ${result.exitCode}: ${result.stderr}`);
}
console.log(JSON.stringify({ samples_ms: samples }));
