// Drives a live hutch server with the real @agentuity/core SandboxClient (pinned in
// package.json). Every check prints one line; the last line is "N passed, M failed" and
// the exit code is non-zero when anything failed. See docs/wire.md for the protocol.
//
//   HUTCH_URL=http://127.0.0.1:8080 HUTCH_API_KEY=... node compat.mjs
//
// Optional env: HUTCH_COMPAT_RUNTIME (default base:latest), HUTCH_COMPAT_CHECK_TIMEOUT_MS
// (per check, default 180000), HUTCH_COMPAT_ONLY (substring filter on check names),
// HUTCH_COMPAT_EXTENDED=1 (also file-system endpoints, setEnv, jobs, pause/resume + autoResumed),
// HUTCH_COMPAT_ORG_ID (the organization the client names in orgId).

import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { APIClient, createMinimalLogger } from '@agentuity/core';
import {
	SandboxClient,
	snapshotBuildFinalize,
	snapshotBuildInit,
	snapshotPublicGet,
	snapshotPublicList,
	snapshotUpload,
} from '@agentuity/core/sandbox';
import { gzipSync } from 'node:zlib';

const URL_ = process.env.HUTCH_URL;
const API_KEY = process.env.HUTCH_API_KEY;
if (!URL_ || !API_KEY) {
	console.error('compat.mjs: set HUTCH_URL and HUTCH_API_KEY');
	process.exit(2);
}
// The client falls back to these when apiKey/url are empty; keep them out of the way so
// every check talks to HUTCH_URL with exactly the key it means to.
for (const k of [
	'AGENTUITY_SDK_KEY',
	'AGENTUITY_CLI_KEY',
	'AGENTUITY_SANDBOX_URL',
	'AGENTUITY_CATALYST_URL',
	'AGENTUITY_TRANSPORT_URL',
]) {
	delete process.env[k];
}

const RUNTIME = process.env.HUTCH_COMPAT_RUNTIME || 'base:latest';
const CHECK_TIMEOUT_MS = Number(process.env.HUTCH_COMPAT_CHECK_TIMEOUT_MS || 180_000);
const ONLY = process.env.HUTCH_COMPAT_ONLY || '';
const EXTENDED = process.env.HUTCH_COMPAT_EXTENDED === '1';

const SANDBOX_STATUSES = [
	'creating', 'idle', 'running', 'paused', 'stopping', 'suspended', 'terminated', 'failed', 'deleted',
];
const TERMINAL_EXEC = ['completed', 'failed', 'timeout', 'cancelled'];
const MISSING_SANDBOX = 'sbx_compatdoesnotexist0000';
const MISSING_EXECUTION = 'exec_compatdoesnotexist0000';

// HUTCH_COMPAT_ORG_ID: the client sends orgId on every call (a key of that organization).
const ORG_ID = process.env.HUTCH_COMPAT_ORG_ID || '';
const client = new SandboxClient({ url: URL_, apiKey: API_KEY, ...(ORG_ID ? { orgId: ORG_ID } : {}) });
// stdin goes through Agentuity's stream service, found at AGENTUITY_STREAM_URL: hutch serves
// its part (POST /streams, PUT /streams/{id}).
process.env.AGENTUITY_STREAM_URL = `${URL_}/streams`;

// ---------------------------------------------------------------- harness

let passed = 0;
let failed = 0;
const state = {}; // values shared between checks

function describeError(err) {
	if (!err || typeof err !== 'object') return String(err);
	const bits = [`${err._tag ?? err.name ?? 'Error'}: ${err.message}`];
	if (err.status !== undefined) bits.push(`status=${err.status}`);
	if (err.url) bits.push(`url=${err.url}`);
	if (err.issues) bits.push(`issues=${JSON.stringify(err.issues)}`);
	if (err.code) bits.push(`code=${err.code}`);
	return bits.join(' ');
}

async function check(name, fn, { needs = [] } = {}) {
	if (ONLY && !name.includes(ONLY)) return;
	const missing = needs.filter((k) => state[k] === undefined);
	if (missing.length) {
		failed++;
		console.log(`FAIL ${name}: not run, an earlier check did not provide ${missing.join(', ')}`);
		return;
	}
	let timer;
	try {
		await Promise.race([
			fn(),
			new Promise((_, reject) => {
				timer = setTimeout(
					() => reject(new Error(`timed out after ${CHECK_TIMEOUT_MS} ms`)),
					CHECK_TIMEOUT_MS
				);
			}),
		]);
		passed++;
		console.log(`ok   ${name}`);
	} catch (err) {
		failed++;
		const detail = err instanceof assert.AssertionError ? err.message : describeError(err);
		console.log(`FAIL ${name}: ${detail.replace(/\n/g, '\n     ')}`);
	} finally {
		clearTimeout(timer);
	}
}

/** Await a promise that must reject; returns the error. */
async function rejects(promise, what) {
	try {
		const value = await promise;
		assert.fail(`${what}: expected an error, got ${JSON.stringify(value)}`);
	} catch (err) {
		if (err instanceof assert.AssertionError) throw err;
		return err;
	}
}

const CANNED = [
	'The API endpoint was not found', // non-JSON 404
	'The requested resource was not found', // JSON 404 without message
	'The API request was invalid (HTTP 400)',
	'The API returned an unexpected error',
];

/** The client's APIError for a non-2xx JSON error body carrying a message. */
function assertApiError(err, statuses, what) {
	assert.equal(
		err?._tag,
		'APIErrorResponse',
		`${what}: expected APIError (_tag APIErrorResponse), got ${describeError(err)}`
	);
	const list = Array.isArray(statuses) ? statuses : [statuses];
	assert.ok(
		list.includes(err.status),
		`${what}: expected HTTP ${list.join('/')}, got ${err.status} (${err.message})`
	);
	assert.ok(
		typeof err.message === 'string' && err.message.length > 0,
		`${what}: empty error message`
	);
	for (const c of CANNED) {
		assert.ok(
			!err.message.startsWith(c),
			`${what}: client fell back to its canned message "${err.message}" — the server's error ` +
				'body must be JSON (Content-Type application/json) with a "message" field'
		);
	}
}

function collector() {
	const chunks = [];
	const w = new Writable({
		write(chunk, _enc, cb) {
			chunks.push(Buffer.from(chunk));
			cb();
		},
	});
	w.text = () => Buffer.concat(chunks).toString('utf-8');
	return w;
}

async function readUrl(url, what) {
	assert.equal(typeof url, 'string', `${what}: no stream URL`);
	assert.ok(/^https?:\/\//.test(url), `${what}: stream URL must be absolute, got ${url}`);
	const res = await fetch(url); // no Authorization: the real client fetches these bare
	assert.equal(res.status, 200, `${what}: GET ${url} (no auth header) -> ${res.status}`);
	return await res.text();
}

const isIso = (s) => typeof s === 'string' && !Number.isNaN(Date.parse(s)) && /^\d{4}-\d\d-\d\dT/.test(s);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const enc = (s) => Buffer.from(s, 'utf-8');

// ---------------------------------------------------------------- checks

await check('runtimes: list includes base:latest and python:3.13', async () => {
	const res = await client.listRuntimes();
	assert.ok(Array.isArray(res.runtimes), 'runtimes is not an array');
	const names = res.runtimes.map((r) => r.name);
	for (const n of ['base:latest', 'python:3.13']) {
		assert.ok(names.includes(n), `runtime ${n} missing from ${JSON.stringify(names)}`);
	}
	assert.ok(res.total >= res.runtimes.length, `total ${res.total} < ${res.runtimes.length}`);
	for (const r of res.runtimes) {
		assert.ok(typeof r.id === 'string' && r.id.length > 0, `runtime ${r.name} has no id`);
	}
});

await check('runtimes: limit=1 pages, total counts all', async () => {
	const res = await client.listRuntimes({ limit: 1 });
	assert.equal(res.runtimes.length, 1, `limit=1 returned ${res.runtimes.length} runtimes`);
	assert.ok(res.total >= 2, `total ${res.total} should count every runtime`);
});

await check('run: files + env, exact stdout and exit code', async () => {
	const res = await client.run({
		runtime: RUNTIME,
		env: { GREETING: 'hola' },
		command: {
			exec: ['bash', '-c', 'cat hello.txt; cat sub/dir/b.txt; printf "%s\\n" "$GREETING"; exit 3'],
			files: [
				{ path: 'hello.txt', content: enc('hi from file\n') },
				{ path: 'sub/dir/b.txt', content: enc('nested ✓\n') },
			],
		},
	});
	assert.equal(res.stdout, 'hi from file\nnested ✓\nhola\n', 'stdout');
	assert.equal(res.stderr, '', 'stderr');
	assert.equal(res.exitCode, 3, 'exitCode');
	assert.equal(typeof res.sandboxId, 'string');
	state.oneshotId = res.sandboxId;
});

await check('run: top-level files, exit 0', async () => {
	const res = await client.run({
		runtime: RUNTIME,
		files: [{ path: 'top.txt', content: enc('top-level\n') }],
		command: { exec: ['cat', 'top.txt'] },
	});
	assert.equal(res.stdout, 'top-level\n', 'stdout');
	assert.equal(res.exitCode, 0, 'exitCode');
});

await check('run: stdout/stderr Writables receive the output', async () => {
	const out = collector();
	const err = collector();
	const res = await client.run(
		{
			runtime: RUNTIME,
			command: { exec: ['bash', '-c', 'echo out1; echo err1 >&2; echo out2; echo err2 >&2'] },
		},
		{ stdout: out, stderr: err }
	);
	assert.equal(out.text(), 'out1\nout2\n', 'stdout writable');
	assert.equal(err.text(), 'err1\nerr2\n', 'stderr writable');
	assert.equal(res.stdout, 'out1\nout2\n', 'result.stdout');
	assert.equal(res.stderr, 'err1\nerr2\n', 'result.stderr');
	assert.equal(res.exitCode, 0, 'exitCode');
});

await check('run: stdin through the stream service (AGENTUITY_STREAM_URL)', async () => {
	const { Readable } = await import('node:stream');
	const { createHash } = await import('node:crypto');
	const small = await client.run({ runtime: RUNTIME, command: { exec: ['cat'] } },
		{ stdin: Readable.from([Buffer.from('piped in\n')]) });
	assert.equal(small.stdout, 'piped in\n', 'cat stdout');
	const parts = [Buffer.from('head\n'), Buffer.alloc(3 * 1024 * 1024, 'x'), Buffer.from('tail\n')];
	const digest = createHash('sha256').update(Buffer.concat(parts)).digest('hex');
	const res = await client.run({ runtime: RUNTIME, command: { exec: ['sha256sum'] } },
		{ stdin: Readable.from(parts) });
	assert.equal(res.stdout.split(' ')[0], digest, 'sha256 of 3 MiB of stdin');
	assert.equal(res.exitCode, 0, 'exitCode');
});

await check('run: oneshot sandbox terminates itself with its exit code', async () => {
	// run() never DELETEs on success; the server must end the oneshot sandbox.
	let info;
	for (let i = 0; i < 40; i++) {
		try {
			info = await client.get(state.oneshotId);
		} catch (err) {
			assertApiError(err, 404, 'get of a finished oneshot sandbox');
			return; // gone entirely is acceptable
		}
		if (['terminated', 'failed', 'deleted'].includes(info.status)) break;
		await sleep(250);
	}
	assert.ok(
		['terminated', 'failed', 'deleted'].includes(info.status),
		`status after run is ${info.status}, expected terminated`
	);
	if (info.mode !== undefined) assert.equal(info.mode, 'oneshot', 'mode');
	if (info.exitCode !== undefined) assert.equal(info.exitCode, 3, 'exitCode');
}, { needs: ['oneshotId'] });

await check('create: interactive sandbox', async () => {
	const sbx = await client.create({
		runtime: RUNTIME,
		name: 'compat-interactive',
		env: { FOO: 'bar' },
		metadata: { suite: 'compat' },
	});
	assert.equal(typeof sbx.id, 'string');
	assert.ok(SANDBOX_STATUSES.includes(sbx.status), `status ${sbx.status}`);
	state.sbx = sbx;
});

await check('execute: pipe stdout/stderr, exit code, env', async () => {
	const out = collector();
	const err = collector();
	const ex = await state.sbx.execute({
		command: ['bash', '-c', 'echo "$FOO"; echo e1 >&2; exit 5'],
		pipe: { stdout: out, stderr: err },
	});
	assert.equal(out.text(), 'bar\n', 'piped stdout');
	assert.equal(err.text(), 'e1\n', 'piped stderr');
	assert.equal(typeof ex.executionId, 'string');
	assert.ok(['completed', 'failed'].includes(ex.status), `status ${ex.status}`);
	assert.equal(ex.exitCode, 5, 'exitCode');
	assert.equal(typeof ex.durationMs, 'number', 'durationMs');
	state.ex5 = ex;
}, { needs: ['sbx'] });

await check('execute: stream URLs readable after completion (no auth)', async () => {
	assert.equal(await readUrl(state.ex5.stdoutStreamUrl, 'stdout'), 'bar\n');
	assert.equal(await readUrl(state.ex5.stderrStreamUrl, 'stderr'), 'e1\n');
	assert.notEqual(state.ex5.stdoutStreamUrl, state.ex5.stderrStreamUrl, 'stdout and stderr URLs must differ');
}, { needs: ['ex5'] });

await check('execute: files, then exit 0, workspace persists', async () => {
	const ex = await state.sbx.execute({
		command: ['bash', '-c', 'cat data/x.txt && echo kept > kept.txt'],
		files: [{ path: 'data/x.txt', content: enc('payload 42\n') }],
	});
	assert.equal(ex.status, 'completed', 'status');
	assert.equal(ex.exitCode, 0, 'exitCode');
	assert.equal(await readUrl(ex.stdoutStreamUrl, 'stdout'), 'payload 42\n');
	const ex2 = await state.sbx.execute({ command: ['cat', 'kept.txt', 'data/x.txt'] });
	assert.equal(ex2.exitCode, 0, 'second exitCode');
	assert.equal(await readUrl(ex2.stdoutStreamUrl, 'stdout'), 'kept\npayload 42\n');
	state.ex0 = ex;
}, { needs: ['sbx'] });

await check('execute: pipe delivers output while the command runs', async () => {
	const t0 = Date.now();
	const seen = [];
	const w = new Writable({
		write(chunk, _enc, cb) {
			seen.push([Date.now() - t0, Buffer.from(chunk).toString('utf-8')]);
			cb();
		},
	});
	const ex = await state.sbx.execute({ command: ['bash', '-c', 'echo first; sleep 2; echo second'], pipe: { stdout: w } });
	const total = Date.now() - t0;
	assert.equal(seen.map(([, t]) => t).join(''), 'first\nsecond\n', 'piped text');
	assert.equal(ex.exitCode, 0);
	assert.ok(
		seen[0][0] < total - 1000,
		`first chunk arrived at ${seen[0][0]} ms of ${total} ms: stream URLs must stream while running`
	);
}, { needs: ['sbx'] });

await check('execute: timeout ends with status timeout', async () => {
	const t0 = Date.now();
	const ex = await state.sbx.execute({ command: ['sleep', '30'], timeout: '1s' });
	assert.equal(ex.status, 'timeout', `status ${ex.status} exit ${ex.exitCode}`);
	assert.ok(Date.now() - t0 < 20_000, `took ${Date.now() - t0} ms`);
}, { needs: ['sbx'] });

await check('get: sandbox info', async () => {
	const info = await client.get(state.sbx.id);
	assert.equal(info.sandboxId, state.sbx.id);
	assert.equal(info.status, 'idle', 'status after executions finished');
	assert.ok(isIso(info.createdAt), `createdAt ${info.createdAt}`);
	assert.ok(info.executions >= 5, `executions ${info.executions}`);
	assert.equal(info.name, 'compat-interactive', 'name');
	assert.equal(info.runtime?.name, RUNTIME, 'runtime.name');
	assert.deepEqual(info.metadata, { suite: 'compat' }, 'metadata');
}, { needs: ['sbx'] });

await check('connect: instance executes against an existing id', async () => {
	const inst = await client.connect(state.sbx.id);
	assert.equal(inst.id, state.sbx.id);
	const ex = await inst.execute({ command: ['cat', 'kept.txt'] });
	assert.equal(ex.exitCode, 0);
	assert.equal(await readUrl(ex.stdoutStreamUrl, 'stdout'), 'kept\n');
	const info = await inst.get();
	assert.equal(info.sandboxId, state.sbx.id);
}, { needs: ['sbx'] });

await check('list: contains the sandbox; limit; total', async () => {
	const all = await client.list();
	assert.ok(Array.isArray(all.sandboxes));
	const mine = all.sandboxes.find((s) => s.sandboxId === state.sbx.id);
	assert.ok(mine, `sandbox ${state.sbx.id} not in list`);
	assert.ok(isIso(mine.createdAt), 'createdAt');
	assert.equal(typeof mine.executions, 'number');
	assert.ok(all.total >= all.sandboxes.length, `total ${all.total} < ${all.sandboxes.length}`);
	const one = await client.list({ limit: 1 });
	assert.equal(one.sandboxes.length, 1, 'limit=1');
	assert.equal(one.total, all.total, 'total must not depend on limit');
	const inter = await client.list({ mode: 'interactive' });
	assert.ok(inter.sandboxes.some((s) => s.sandboxId === state.sbx.id), 'mode=interactive filter');
	assert.ok(inter.sandboxes.every((s) => s.mode === undefined || s.mode === 'interactive'), 'mode filter leaks');
}, { needs: ['sbx'] });

await check('executions: list and get', async () => {
	const { executions } = await client.listExecutions(state.sbx.id);
	const ids = executions.map((e) => e.executionId);
	assert.ok(ids.includes(state.ex5.executionId), 'exit-5 execution missing from list');
	for (const e of executions) {
		assert.equal(e.sandboxId, state.sbx.id);
	}
	const limited = await client.listExecutions(state.sbx.id, 1);
	assert.equal(limited.executions.length, 1, 'limit=1');
	const got = await client.getExecution(state.ex5.executionId);
	assert.equal(got.executionId, state.ex5.executionId);
	assert.equal(got.sandboxId, state.sbx.id);
	assert.ok(TERMINAL_EXEC.includes(got.status), `status ${got.status}`);
	assert.equal(got.exitCode, 5);
	if (got.startedAt !== undefined) assert.ok(isIso(got.startedAt), `startedAt ${got.startedAt}`);
	if (got.completedAt !== undefined) assert.ok(isIso(got.completedAt), `completedAt ${got.completedAt}`);
	const waited = await client.getExecution(state.ex5.executionId, '1s');
	assert.equal(waited.exitCode, 5, 'with wait=1s');
}, { needs: ['sbx', 'ex5'] });

await check('events: asc/desc/limit', async () => {
	const asc = (await client.listEvents(state.sbx.id)).events;
	assert.ok(asc.length >= 1, 'no events');
	assert.equal(asc[0].type, 'create', `first event is ${asc[0].type}`);
	for (const e of asc) {
		assert.equal(e.sandboxId, state.sbx.id);
		assert.ok(isIso(e.createdAt), `createdAt ${e.createdAt}`);
		assert.equal(typeof e.event, 'object');
	}
	for (let i = 1; i < asc.length; i++) {
		assert.ok(Date.parse(asc[i - 1].createdAt) <= Date.parse(asc[i].createdAt), 'asc order');
	}
	const desc = (await client.listEvents(state.sbx.id, { direction: 'desc' })).events;
	assert.deepEqual(
		desc.map((e) => e.eventId),
		asc.map((e) => e.eventId).reverse(),
		'desc must be asc reversed'
	);
	const first = (await client.listEvents(state.sbx.id, { limit: 1 })).events;
	assert.equal(first.length, 1, 'limit=1');
	assert.equal(first[0].eventId, asc[0].eventId, 'limit=1 asc is the oldest');
	const last = (await client.listEvents(state.sbx.id, { limit: 1, direction: 'desc' })).events;
	assert.equal(last[0].eventId, asc[asc.length - 1].eventId, 'limit=1 desc is the newest');
}, { needs: ['sbx'] });

if (EXTENDED) {
	await check('run: resources.disk is enforced (ENOSPC at the limit, df shows it)', async () => {
		const res = await client.run({
			runtime: RUNTIME,
			resources: { disk: '32Mi' },
			command: { exec: ['sh', '-c', 'dd if=/dev/zero of=big bs=1M count=64 2>&1 | head -1; rm big; df -k . | tail -1'] },
		});
		assert.match(res.stdout, /No space left on device/, 'dd past the limit');
		const total = Number(res.stdout.trim().split('\n').pop().split(/\s+/)[1]);
		assert.ok(total > 16 * 1024 && total <= 32 * 1024, `df size ${total} KiB`);
		assert.equal(res.exitCode, 0, 'exitCode');
	});

	await check('fs: writeFiles / readFile / listFiles / rm / mkdir', async () => {
		const n = await state.sbx.writeFiles([{ path: 'fs/a.txt', content: enc('A') }]);
		assert.equal(n, 1, 'filesWritten');
		const body = await new Response(await state.sbx.readFile('fs/a.txt')).text();
		assert.equal(body, 'A');
		const files = await state.sbx.listFiles('fs');
		assert.ok(files.some((f) => f.path.endsWith('a.txt') && f.size === 1 && !f.isDir), JSON.stringify(files));
		await state.sbx.mkDir('fs/d/e', true);
		assert.deepEqual(await state.sbx.rmFile('fs/a.txt'), { found: true });
		assert.deepEqual(await state.sbx.rmFile('fs/a.txt'), { found: false });
		assert.deepEqual(await state.sbx.rmDir('fs/d', true), { found: true });
	}, { needs: ['sbx'] });

	await check('env: setEnv sets and deletes', async () => {
		const env = await state.sbx.setEnv({ NEWVAR: 'x', FOO: null });
		assert.equal(env.NEWVAR, 'x');
		assert.equal(env.FOO, undefined);
		const ex = await state.sbx.execute({ command: ['bash', '-c', 'echo "${NEWVAR}-${FOO:-unset}"'] });
		assert.equal(await readUrl(ex.stdoutStreamUrl, 'stdout'), 'x-unset\n');
	}, { needs: ['sbx'] });

	await check('jobs: createJob / job.get / listJobs / job.stop(force) / failed exit code', async () => {
		const job = await client.createJob(state.sbx.id, { command: ['sh', '-c', 'echo job-out; sleep 60'] });
		assert.ok(job.id, 'job id');
		assert.equal(job.sandboxId, state.sbx.id);
		const current = await job.get();
		assert.ok(['pending', 'running'].includes(current.status), current.status);
		assert.ok(current.stdoutStreamUrl && current.stderrStreamUrl, 'stream URLs');
		const { jobs } = await client.listJobs(state.sbx.id, 10);
		assert.ok(jobs.some((j) => j.jobId === job.id), JSON.stringify(jobs));
		const stopped = await job.stop(true);
		assert.equal(stopped.status, 'cancelled');
		const quick = await client.createJob(state.sbx.id, { command: ['sh', '-c', 'echo done; exit 3'] });
		let final;
		for (let i = 0; i < 200; i++) {
			final = await quick.get();
			if (['completed', 'failed', 'cancelled'].includes(final.status)) break;
			await sleep(50);
		}
		assert.equal(final.status, 'failed');
		assert.equal(final.exitCode, 3);
		assert.equal(await readUrl(final.stdoutStreamUrl, 'job stdout'), 'done\n');
	}, { needs: ['sbx'] });

	await check('pause/resume: pause, execute auto-resumes (autoResumed), resume', async () => {
		await state.sbx.writeFiles([{ path: 'keep/p.txt', content: enc('kept') }]);
		const paused = await state.sbx.pause();
		assert.equal(paused.sandboxId ?? state.sbx.id, state.sbx.id);
		assert.equal((await client.get(state.sbx.id)).status, 'paused');
		// SandboxInstance.execute() in @agentuity/core 2.0.21 drops the wire's top-level
		// autoResumed, so read it from the execute response itself.
		const resp = await fetch(`${URL_}/sandbox/${state.sbx.id}/execute`, {
			method: 'POST',
			headers: { Authorization: `Bearer ${API_KEY}`, 'Content-Type': 'application/json' },
			body: JSON.stringify({ command: ['cat', 'keep/p.txt'] }),
		});
		const body = await resp.json();
		assert.equal(resp.status, 200, JSON.stringify(body));
		assert.equal(body.autoResumed, true, 'autoResumed');
		assert.notEqual((await client.get(state.sbx.id)).status, 'paused');
		assert.equal(await readUrl(body.data.stdoutStreamUrl, 'stdout'), 'kept');
		await state.sbx.pause();
		await state.sbx.resume();
		const after = (await client.get(state.sbx.id)).status;
		assert.ok(['idle', 'running'].includes(after), after);
	}, { needs: ['sbx'] });
}

// ---- disk checkpoints (extended drivers)

async function catIn(sandbox, path) {
	const ex = await sandbox.execute({ command: ['cat', path] });
	return await readUrl(ex.stdoutStreamUrl, `cat ${path}`);
}


if (EXTENDED) {
	await check('checkpoints: createDiskCheckpoint, list, get, restore brings files back, delete', async () => {
		const sbx = await client.create({ runtime: RUNTIME });
		await sbx.writeFiles([{ path: 'ck/kept.txt', content: enc('before') }]);
		const cp = await client.createDiskCheckpoint(sbx.id, 'base');
		assert.ok(cp.id.startsWith('ckpt_'), cp.id);
		assert.equal(cp.name, 'base');
		assert.ok(isIso(cp.createdAt), cp.createdAt);
		await sbx.writeFiles([{ path: 'ck/kept.txt', content: enc('after') }, { path: 'ck/new.txt', content: enc('x') }]);
		const listed = await client.listDiskCheckpoints(sbx.id);
		assert.deepEqual(listed.map((c) => c.name), ['base']);
		const again = await client.getDiskCheckpoint(sbx.id, cp.id);
		await again.restore();
		assert.equal(await catIn(sbx, 'ck/kept.txt'), 'before');
		const ls = await sbx.execute({ command: ['ls', 'ck'] });
		assert.equal(await readUrl(ls.stdoutStreamUrl, 'ls'), 'kept.txt\n', 'a file made after the checkpoint is gone');
		await again.delete();
		assert.deepEqual(await client.listDiskCheckpoints(sbx.id), []);
		await sbx.destroy();
	});
}

if (EXTENDED) {
	await check('cancel: an AbortSignal on execute() ends the command (after the server\'s grace)', async () => {
		const sbx = await client.create({ runtime: RUNTIME });
		const ac = new AbortController();
		const pending = sbx.execute({ command: ['sleep', '60'], signal: ac.signal });
		await sleep(800);
		ac.abort();
		await rejects(pending, 'aborted execute');
		let ex;
		for (let i = 0; i < 150; i++) {  // the grace is 3 s
			ex = (await client.listExecutions(sbx.id)).executions.find((e) => e.command?.[1] === '60');
			if (ex && TERMINAL_EXEC.includes(ex.status)) break;
			await sleep(100);
		}
		assert.equal(ex?.status, 'cancelled', `the aborted command is ${ex?.status}, not cancelled`);
		const after = await sbx.execute({ command: ['echo', 'still usable'] });
		assert.equal(await readUrl(after.stdoutStreamUrl, 'echo'), 'still usable\n');
		await sbx.destroy();
	});
}

if (EXTENDED) {
	await check('destroy: a command running when its sandbox is destroyed ends cancelled, saying so', async () => {
		const sbx = await client.create({ runtime: RUNTIME });
		const pending = sbx.execute({ command: ['sleep', '30'] });
		await sleep(800);
		await sbx.destroy();
		const done = await pending;  // the client's own wait: its long-poll answered at the destroy
		assert.equal(done.status, 'cancelled', `the destroyed sandbox's command is ${done.status}`);
		assert.equal(done.exitCode, 137);
		const got = await client.getExecution(done.executionId);
		assert.equal(got.status, 'cancelled');
		assert.equal(got.error, 'sandbox ended: destroyed on request');
		const events = (await client.listEvents(sbx.id, { limit: 100 })).events;
		const ends = events.filter((e) => e.type === 'execution:finished');
		assert.equal(ends.length, 1, `execution:finished events: ${events.map((e) => e.type).join(', ')}`);
		assert.equal(ends[0].event.status, 'cancelled');
		assert.equal(ends[0].event.error, got.error);
	});
}

// ---- snapshots (the workspace is read through the file primitives: extended drivers only)

if (EXTENDED) {

	/** A one-file ustar archive, gzipped: what `agentuity cloud sandbox snapshot build` uploads. */
	function tarGz(name, text) {
		const body = enc(text);
		const header = Buffer.alloc(512, 0);
		header.write(name, 0, 'utf-8');
		header.write('0000644\0', 100);
		header.write('0000000\0', 108);
		header.write('0000000\0', 116);
		header.write(body.length.toString(8).padStart(11, '0') + '\0', 124);
		header.write('00000000000\0', 136);
		header.write('        ', 148);
		header.write('0', 156);
		header.write('ustar\0', 257);
		header.write('00', 263);
		let sum = 0;
		for (const b of header) sum += b;
		header.write(sum.toString(8).padStart(6, '0') + '\0 ', 148);
		const pad = Buffer.alloc((512 - (body.length % 512)) % 512, 0);
		return gzipSync(Buffer.concat([header, body, pad, Buffer.alloc(1024, 0)]));
	}

	
	await check('snapshots: createSnapshot, create({snapshot}) restores files and env, get/list', async () => {
		const src = await client.create({ runtime: RUNTIME, env: { FROM_SNAP: 'yes' } });
		await src.writeFiles([{ path: 'snap/a.txt', content: enc('in the snapshot\n') }]);
		const snap = await client.createSnapshot(src.id, { name: 'compat', tag: 'v1', description: 'compat run' });
		assert.ok(snap.snapshotId.startsWith('snp_'), snap.snapshotId);
		assert.equal(snap.name, 'compat');
		assert.equal(snap.tag, 'v1');
		assert.equal(snap.fileCount, 1);
		assert.ok(isIso(snap.createdAt), snap.createdAt);
		const child = await client.create({ snapshot: snap.snapshotId });
		assert.equal(await catIn(child, 'snap/a.txt'), 'in the snapshot\n');
		const ex = await child.execute({ command: ['bash', '-c', 'echo $FROM_SNAP'] });
		assert.equal(await readUrl(ex.stdoutStreamUrl, 'env'), 'yes\n');
		const byName = await client.create({ snapshot: 'compat:v1' });
		assert.equal(await catIn(byName, 'snap/a.txt'), 'in the snapshot\n');
		const got = await client.getSnapshot(snap.snapshotId);
		assert.equal(got.files?.[0]?.path, 'snap/a.txt');
		assert.equal(got.files?.[0]?.size, 16);
		const listed = await client.listSnapshots({ sandboxId: src.id });
		assert.deepEqual(listed.snapshots.map((s) => s.snapshotId), [snap.snapshotId]);
		assert.equal(listed.total, 1);
		const made = await client.list({ snapshotId: snap.snapshotId });
		assert.equal(made.total, 2, `sandboxes made from the snapshot: ${made.total}`);
		state.snap = snap;
		state.snapChild = child;
		await src.destroy();
		await byName.destroy();
	});

	await check('snapshots: both snapshot and runtime -> client-side error; unknown snapshot -> 404', async () => {
		const err = await rejects(client.create({ snapshot: 'snp_whatever', runtime: RUNTIME }), 'both');
		const said = `${err.message} ${JSON.stringify(err.issues ?? '')}`;
		assert.ok(/snapshot/.test(said), said); // the client's own validation, before any request
		// Raw wire too: the server refuses it by itself, naming the field.
		const resp = await fetch(`${URL_}/sandbox`, {
			method: 'POST',
			headers: { Authorization: `Bearer ${API_KEY}`, 'Content-Type': 'application/json' },
			body: JSON.stringify({ snapshot: state.snap?.snapshotId ?? 'x:y', runtime: RUNTIME }),
		});
		assert.equal(resp.status, 400);
		assert.equal((await resp.json()).field, 'snapshot');
		assertApiError(await rejects(client.create({ snapshot: 'nosuch:tag' }), 'unknown'), 404, 'unknown snapshot');
		assertApiError(await rejects(client.getSnapshot('snp_compatdoesnotexist00'), 'get'), 404, 'getSnapshot');
	}, { needs: ['snap'] });

	await check('snapshots: tagSnapshot, getSnapshotLineage, deleteSnapshot', async () => {
		await state.snapChild.writeFiles([{ path: 'snap/b.txt', content: enc('second') }]);
		const second = await client.createSnapshot(state.snapChild.id, { name: 'compat', tag: 'v2' });
		assert.equal(second.parentSnapshotId, state.snap.snapshotId);
		const lineage = await client.getSnapshotLineage({ snapshot: second.snapshotId });
		assert.deepEqual(lineage.lineage.map((e) => e.snapshotId), [second.snapshotId, state.snap.snapshotId]);
		assert.equal(lineage.total, 2);
		const tagged = await client.tagSnapshot(state.snap.snapshotId, 'stable');
		assert.equal(tagged.tag, 'stable');
		const cleared = await client.tagSnapshot(state.snap.snapshotId, null);
		assert.ok(cleared.tag === undefined || cleared.tag === null, `tag after clear: ${cleared.tag}`);
		await client.deleteSnapshot(state.snap.snapshotId);
		assertApiError(await rejects(client.getSnapshot(state.snap.snapshotId), 'get deleted'), 404, 'deleted');
		const after = await client.getSnapshotLineage({ name: 'compat', tag: 'v2' });
		assert.deepEqual(after.lineage.map((e) => !!e.deleted), [false, true]);
		await client.deleteSnapshot(second.snapshotId);
		await state.snapChild.destroy();
	}, { needs: ['snap'] });

	await check('snapshots: build init -> upload (client and presigned URL) -> finalize; public get/list', async () => {
		const api = new APIClient(URL_, createMinimalLogger(), API_KEY, { maxRetries: 0 });
		const init = await snapshotBuildInit(api, { runtime: RUNTIME, name: 'compat-built', contentHash: 'h1', public: true });
		assert.ok(init.snapshotId?.startsWith('snp_'), JSON.stringify(init));
		const archive = tarGz('tool.txt', 'built\n');
		const up = await snapshotUpload(api, { snapshotId: init.snapshotId, body: archive, contentLength: archive.length });
		assert.equal(up.success, true);
		// The presigned uploadUrl works with no key at all.
		const put = await fetch(init.uploadUrl, { method: 'PUT', body: archive, headers: { 'Content-Type': 'application/gzip' } });
		assert.equal(put.status, 200, `PUT uploadUrl -> ${put.status}`);
		const done = await snapshotBuildFinalize(api, {
			snapshotId: init.snapshotId, sizeBytes: archive.length, fileCount: 1,
			files: [{ path: 'tool.txt', size: 6, sha256: '', contentType: 'text/plain', mode: 0o644 }],
			env: { BUILT: '1' }, metadata: { by: 'compat' },
		});
		assert.equal(done.fileCount, 1);
		assert.deepEqual(done.userMetadata, { by: 'compat' });
		const again = await snapshotBuildInit(api, { runtime: RUNTIME, name: 'compat-built', contentHash: 'h1' });
		assert.equal(again.unchanged, true);
		assert.equal(again.existingId, init.snapshotId);
		const anon = new APIClient(URL_, createMinimalLogger(), '', { maxRetries: 0 });
		const pub = await snapshotPublicGet(anon, { snapshotRef: 'compat-built:latest' });
		assert.equal(pub.snapshotId, init.snapshotId);
		const pubList = await snapshotPublicList(anon, {});
		assert.ok(pubList.snapshots.some((s) => s.snapshotId === init.snapshotId));
		const sbx = await client.create({ snapshot: init.snapshotId });
		assert.equal(await catIn(sbx, 'tool.txt'), 'built\n');
		await sbx.destroy();
		await client.deleteSnapshot(init.snapshotId);
	});
}

// ---- @agentuity/runtime's ctx.sandbox (HTTPSandboxService), the service an agent's handler gets.
// The package exports it only through its runtime bootstrap, so it is loaded from its own file.

await check('runtime ctx.sandbox: an interactive sandbox\'s stdout/stderr carry every execution, live', async () => {
	const { HTTPSandboxService } = await import(
		new URL('./node_modules/@agentuity/runtime/dist/services/sandbox/http.js', import.meta.url)
	);
	const api = new APIClient(URL_, createMinimalLogger(), API_KEY, { maxRetries: 0 });
	const svc = new HTTPSandboxService(api, `${URL_}/streams`, ORG_ID || undefined);
	const sbx = await svc.create({ runtime: RUNTIME });
	assert.ok(sbx.stdout.id && sbx.stderr.id && !sbx.interleaved, `streams: ${sbx.stdout.id} ${sbx.stderr.id}`);
	const text = async (stream) => Buffer.from(await new Response(stream.getReader()).arrayBuffer()).toString();
	const out = text(sbx.stdout); // read while the commands run: it follows the sandbox
	const err = text(sbx.stderr);
	const first = await sbx.execute({ command: ['sh', '-c', 'echo one; echo e1 >&2'] });
	assert.equal(first.exitCode, 0);
	await sbx.execute({ command: ['sh', '-c', 'echo two'] });
	const connected = await svc.connect(sbx.id); // connect() reads the get answer's URLs
	assert.equal(connected.stdout.id, sbx.stdout.id);
	const later = text(connected.stdout);
	await sbx.destroy();
	assert.equal(await out, 'one\ntwo\n', 'stdout');
	assert.equal(await err, 'e1\n', 'stderr');
	assert.equal(await later, 'one\ntwo\n', 'stdout through connect()');
});

// ---- errors

await check('errors: unknown sandbox id -> APIError 404 (get, destroy, executions, events)', async () => {
	assertApiError(await rejects(client.get(MISSING_SANDBOX), 'get'), 404, 'get');
	assertApiError(await rejects(client.destroy(MISSING_SANDBOX), 'destroy'), 404, 'destroy');
	assertApiError(await rejects(client.listExecutions(MISSING_SANDBOX), 'listExecutions'), 404, 'listExecutions');
	assertApiError(await rejects(client.listEvents(MISSING_SANDBOX), 'listEvents'), 404, 'listEvents');
});

await check('errors: unknown execution id -> APIError 404', async () => {
	assertApiError(await rejects(client.getExecution(MISSING_EXECUTION), 'getExecution'), 404, 'getExecution');
});

await check('errors: bad runtime -> APIError 4xx (create and run)', async () => {
	const e1 = await rejects(client.create({ runtime: 'nosuchruntime:0' }), 'create');
	assertApiError(e1, [400, 404, 422], 'create with bad runtime');
	const e2 = await rejects(
		client.run({ runtime: 'nosuchruntime:0', command: { exec: ['true'] } }),
		'run'
	);
	assertApiError(e2, [400, 404, 422], 'run with bad runtime');
});

await check('errors: wrong API key -> APIError 401', async () => {
	const bad = new SandboxClient({ url: URL_, apiKey: `${API_KEY}-wrong` });
	assertApiError(await rejects(bad.listRuntimes(), 'listRuntimes'), 401, 'wrong key');
	assertApiError(await rejects(bad.list(), 'list'), 401, 'wrong key (list)');
	assertApiError(await rejects(bad.get(state.sbx?.id ?? MISSING_SANDBOX), 'get'), 401, 'wrong key (get)');
});

await check('errors: missing API key -> APIError 401', async () => {
	const none = new SandboxClient({ url: URL_, apiKey: '' }); // sends no Authorization header
	assertApiError(await rejects(none.listRuntimes(), 'listRuntimes'), 401, 'no key');
});

// ---- destroy last

await check('destroy: sandbox goes away; execute afterwards fails fast', async () => {
	await state.sbx.destroy();
	let info;
	try {
		info = await client.get(state.sbx.id);
	} catch (err) {
		assertApiError(err, 404, 'get after destroy');
	}
	if (info) {
		assert.ok(
			['stopping', 'terminated', 'deleted'].includes(info.status),
			`status after destroy: ${info.status}`
		);
	}
	const err = await rejects(state.sbx.execute({ command: ['true'] }), 'execute after destroy');
	const tag = err?._tag;
	// 404 -> SandboxNotFoundError (client-side mapping). A 409 would surface as the
	// misleading SandboxBusyError, so it is not accepted here (docs/wire.md §2.7).
	assert.ok(
		['SandboxNotFoundError', 'SandboxTerminatedError'].includes(tag) ||
			(tag === 'APIErrorResponse' && [400, 404, 410].includes(err.status)),
		`execute after destroy: expected SandboxNotFoundError (HTTP 404), got ${describeError(err)}`
	);
	const gone = await client.list();
	const still = gone.sandboxes.find((s) => s.sandboxId === state.sbx.id);
	assert.ok(!still || ['stopping', 'terminated', 'deleted'].includes(still.status), `listed as ${still?.status}`);
}, { needs: ['sbx'] });

// ---------------------------------------------------------------- first use
// HUTCH_COMPAT_FIRST_USE names a catalog runtime the server has not built: the real client's
// run() and create() + execute() must work without knowing a build happens first.
const FIRST_USE = process.env.HUTCH_COMPAT_FIRST_USE || '';
if (FIRST_USE) {
	await check('first use: run() and create() + execute() of an unbuilt runtime, at once', async () => {
		// The client's schema drops hutch's `available`: ask the wire itself.
		const runtimes = async () => (await (await fetch(`${URL_}/sandbox/runtimes`, {
			headers: { Authorization: `Bearer ${API_KEY}` },
		})).json()).data.runtimes;
		const before = (await runtimes()).find((r) => r.name === FIRST_USE);
		assert.equal(before?.available, false, `${FIRST_USE} must not be built yet: ${JSON.stringify(before)}`);
		const [sbx, ran] = await Promise.all([
			client.create({ runtime: FIRST_USE }),
			client.run({ runtime: FIRST_USE, command: { exec: ['sh', '-c', 'echo first use; exit 4'] } }),
		]);
		assert.equal(ran.stdout, 'first use\n', 'run stdout');
		assert.equal(ran.exitCode, 4, 'run exitCode');
		const res = await sbx.execute({ command: ['sh', '-c', 'echo executed'] });
		const out = await readUrl(res.stdoutStreamUrl, 'stdout');
		assert.equal(out, 'executed\n', 'execute stdout');
		const after = (await runtimes()).find((r) => r.name === FIRST_USE);
		assert.equal(after?.available, true, `${FIRST_USE} after its first use: ${JSON.stringify(after)}`);
		await sbx.destroy();
	});
}

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
