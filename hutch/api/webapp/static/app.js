// The hutch Web App: one page, hash routes, the server's own API behind the session cookie.
// Everything from the API is put on the page as text (never as HTML): names, env values and
// file contents are the sandbox owner's data.
'use strict';

const $ = (sel, root = document) => root.querySelector(sel);
const main = $('#main');
let me = null; // {keyId, orgId, role, serverAdmin}
let live = null; // the EventSource of /app/live
let onLive = () => {}; // what the current page does when an event arrives
const canWrite = () => me && me.role !== 'read-only';

// ------------------------------------------------------------------ plumbing

function h(tag, attrs = {}, ...children) {
	const el = document.createElement(tag);
	for (const [k, v] of Object.entries(attrs || {})) {
		if (v === null || v === undefined || v === false) continue;
		if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
		else if (k === 'dataset') Object.assign(el.dataset, v);
		else el.setAttribute(k, v === true ? '' : String(v));
	}
	for (const c of children.flat()) {
		if (c === null || c === undefined || c === false) continue;
		el.append(c instanceof Node ? c : document.createTextNode(String(c)));
	}
	return el;
}

// replaceChildren, without the "null" text it makes of a left-out (null) child.
function fill(el, ...kids) {
	el.replaceChildren(...kids.flat().filter((k) => k !== null && k !== undefined && k !== false));
	return el;
}

function cookie(name) {
	const m = document.cookie.split('; ').find((c) => c.startsWith(name + '='));
	return m ? decodeURIComponent(m.slice(name.length + 1)) : '';
}

class ApiError extends Error {}
// A request the server refused for want of a session (signed out, or it expired): the sign-in
// page is the answer, not an error box ("missing Authorization header" after signing out).
class SignedOut extends ApiError {}

async function api(method, path, body, { raw = false } = {}) {
	const headers = { Accept: 'application/json' };
	// Over TLS the server names its cookies __Host-… (a sibling host cannot plant them).
	if (method !== 'GET') headers['X-CSRF-Token'] = cookie('__Host-hutch_csrf') || cookie('hutch_csrf');
	let payload;
	if (body instanceof Blob || body instanceof ArrayBuffer) payload = body;
	else if (body !== undefined) {
		headers['Content-Type'] = 'application/json';
		payload = JSON.stringify(body);
	}
	const resp = await fetch(path, { method, headers, body: payload, credentials: 'same-origin' });
	if (raw && resp.ok) return resp;
	let data = null;
	try {
		data = await resp.json();
	} catch {
		data = null;
	}
	if (!resp.ok || (data && data.success === false)) {
		const msg = data && data.message ? data.message : `${method} ${path}: HTTP ${resp.status}`;
		if (resp.status === 401 && path !== '/app/session') {
			if (me) {
				me = null;
				route();
			}
			throw new SignedOut(msg);
		}
		throw new ApiError(msg);
	}
	return data && 'data' in data ? data.data : data;
}

function showError(err) {
	if (err instanceof SignedOut) return;
	const box = $('#error');
	box.textContent = err instanceof Error ? err.message : String(err);
	box.hidden = false;
}

function clearError() {
	$('#error').hidden = true;
}

// Run an action from a button: errors in words, never a blank page.
function act(fn) {
	return async (ev) => {
		if (ev) ev.preventDefault();
		clearError();
		try {
			await fn(ev);
		} catch (err) {
			showError(err);
		}
	};
}

const badge = (status) => h('span', { class: `badge ${status}`, 'data-status': status }, status);
const when = (iso) => (iso ? iso.replace('T', ' ').replace(/\.\d+Z$|Z$/, ' UTC') : '');
const bytes = (n) => (n == null ? '' : n < 1024 ? `${n} B` : n < 1 << 20 ? `${(n / 1024).toFixed(1)} KiB` : `${(n / (1 << 20)).toFixed(1)} MiB`);

function runtimeCell(rt) {
	if (!rt) return '';
	// The catalog's icons live on another site (no CDN here): a monogram in the brand colour.
	const swatch = h('span', { class: 'swatch', title: rt.brandColor || '', 'aria-hidden': 'true' }, (rt.name || '?')[0].toUpperCase());
	swatch.style.background = /^#[0-9a-fA-F]{3,8}$/.test(rt.brandColor || '') ? rt.brandColor : '#888';
	return h('span', {}, swatch, rt.name);
}

function startLive() {
	if (live) return;
	live = new EventSource('/app/live');
	live.onmessage = (msg) => {
		try {
			onLive(JSON.parse(msg.data));
		} catch (err) {
			showError(err);
		}
	};
}

function debounce(fn, ms) {
	let t = null;
	return (...args) => {
		clearTimeout(t);
		t = setTimeout(() => fn(...args), ms);
	};
}

// ------------------------------------------------------------------ sign in / out

function signInPage() {
	$('#top').hidden = true;
	const key = h('input', { type: 'password', id: 'api-key', name: 'apiKey', autocomplete: 'off', required: true });
	fill(main, 
		h('form', { class: 'signin card', id: 'sign-in', onsubmit: act(async () => {
			const got = await api('POST', '/app/session', { apiKey: key.value });
			me = got;
			key.value = '';
			location.hash = '#/';
			route();
		}) },
		h('h1', {}, 'Sign in to hutch'),
		h('label', { for: 'api-key' }, 'API key', key),
		h('p', {}, h('button', { type: 'submit' }, 'Sign in')),
		h('p', { class: 'muted' }, 'The key stays on the server: the browser keeps only a session cookie.')),
	);
	key.focus();
}

async function signOut() {
	await api('DELETE', '/app/session');
	me = null;
	if (live) live.close();
	live = null;
	location.hash = '#/';
	route();
}

// ------------------------------------------------------------------ sandboxes

async function sandboxesPage() {
	const status = h('select', { id: 'filter-status', onchange: () => refresh() },
		['', 'creating', 'idle', 'running', 'paused', 'terminated', 'failed'].map((s) => h('option', { value: s }, s || 'any status')));
	const sort = h('select', { id: 'sort', onchange: () => refresh() },
		[['created', 'newest'], ['name', 'name'], ['status', 'status']].map(([v, t]) => h('option', { value: v }, t)));
	const table = h('tbody', { id: 'sandboxes' });
	const destroyBtn = h('button', { class: 'danger', id: 'destroy-selected', hidden: !canWrite(), onclick: act(async () => {
		const ids = [...table.querySelectorAll('input[type=checkbox]:checked')].map((c) => c.value);
		for (const id of ids) await api('DELETE', `/sandbox/${id}`);
		await refresh();
	}) }, 'Destroy selected');
	fill(main, 
		h('h1', {}, 'Sandboxes'),
		canWrite() ? await createForm() : null,
		h('div', { class: 'row' }, h('label', {}, 'Status', status), h('label', {}, 'Sort', sort), destroyBtn),
		h('div', { class: 'scroll' }, h('table', {}, h('thead', {}, h('tr', {}, h('th', {}, ''), h('th', {}, 'Sandbox'),
			h('th', {}, 'Name'), h('th', {}, 'Runtime'), h('th', {}, 'Status'), h('th', { class: 'wide' }, 'Created'))), table)),
	);
	async function refresh() {
		const q = new URLSearchParams({ limit: '100', sort: sort.value, direction: sort.value === 'name' ? 'asc' : 'desc' });
		if (status.value) q.set('status', status.value);
		const got = await api('GET', `/sandbox?${q}`);
		fill(table, ...got.sandboxes.map((sb) => h('tr', { dataset: { id: sb.sandboxId } },
			h('td', {}, canWrite() && !['terminated', 'failed'].includes(sb.status) ? h('input', { type: 'checkbox', value: sb.sandboxId, 'aria-label': `select ${sb.sandboxId}` }) : ''),
			h('td', {}, h('a', { href: `#/sandbox/${sb.sandboxId}`, class: 'mono' }, sb.sandboxId)),
			h('td', {}, sb.name || ''), h('td', {}, runtimeCell(sb.runtime)), h('td', {}, badge(sb.status)),
			h('td', { class: 'wide' }, when(sb.createdAt)))));
		if (!got.sandboxes.length) fill(table, h('tr', {}, h('td', { colspan: 6 }, 'No sandboxes yet.')));
	}
	onLive = debounce(() => refresh().catch(showError), 150); // the log says something changed
	await refresh();
}

async function createForm() {
	const runtimes = (await api('GET', '/sandbox/runtimes')).runtimes;
	const f = {
		runtime: h('select', { name: 'runtime' }, runtimes.map((r) => h('option', { value: r.name, selected: r.name === 'base:latest' }, r.name))),
		name: h('input', { name: 'name', placeholder: 'optional' }),
		memory: h('input', { name: 'memory', placeholder: '512Mi', size: 7 }),
		cpu: h('input', { name: 'cpu', placeholder: '1000m', size: 7 }),
		env: h('textarea', { name: 'env', rows: 2, placeholder: 'KEY=value per line' }),
		network: h('input', { type: 'checkbox', name: 'network' }),
		port: h('input', { name: 'port', type: 'number', min: 1, max: 65535, size: 6 }),
		idle: h('input', { name: 'idle', placeholder: '10m', size: 6 }),
		deps: h('input', { name: 'dependencies', placeholder: 'apt: jq, vim-tiny' }),
		pkgs: h('input', { name: 'packages', placeholder: 'npm: typescript@5' }),
		snapshot: h('input', { name: 'snapshot', placeholder: 'snapshot id or name:tag' }),
	};
	const list = (s) => s.split(',').map((x) => x.trim()).filter(Boolean);
	return h('details', { class: 'card' }, h('summary', {}, 'Create a sandbox'),
		h('form', { class: 'grid', id: 'create', onsubmit: act(async () => {
			const body = { runtime: f.runtime.value };
			if (f.name.value) body.name = f.name.value;
			if (f.memory.value || f.cpu.value) body.resources = { ...(f.memory.value && { memory: f.memory.value }), ...(f.cpu.value && { cpu: f.cpu.value }) };
			const env = parseEnv(f.env.value);
			if (Object.keys(env).length) body.env = env;
			if (f.network.checked || f.port.value) body.network = { enabled: f.network.checked, ...(f.port.value && { port: Number(f.port.value) }) };
			if (f.idle.value) body.timeout = { idle: f.idle.value };
			if (f.deps.value) body.dependencies = list(f.deps.value);
			if (f.pkgs.value) body.packages = list(f.pkgs.value);
			if (f.snapshot.value) body.snapshot = f.snapshot.value;
			const made = await api('POST', '/sandbox', body);
			location.hash = `#/sandbox/${made.sandboxId}`;
		}) },
		h('label', {}, 'Runtime', f.runtime), h('label', {}, 'Name', f.name), h('label', {}, 'Memory', f.memory),
		h('label', {}, 'CPU', f.cpu), h('label', {}, 'Env', f.env), h('label', {}, 'Network', f.network),
		h('label', {}, 'Port', f.port), h('label', {}, 'Idle timeout', f.idle), h('label', {}, 'Dependencies', f.deps),
		h('label', {}, 'Packages', f.pkgs), h('label', {}, 'From snapshot', f.snapshot),
		h('button', { type: 'submit', id: 'create-submit' }, 'Create')));
}

function parseEnv(text) {
	const env = {};
	for (const line of text.split('\n')) {
		const t = line.trim();
		if (!t) continue;
		const i = t.indexOf('=');
		if (i <= 0) throw new ApiError(`env: "${t}" is not KEY=value`);
		env[t.slice(0, i)] = t.slice(i + 1);
	}
	return env;
}

// ------------------------------------------------------------------ one sandbox

async function sandboxPage(id) {
	const head = h('div', { id: 'sandbox-head' });
	const info = h('div', { id: 'sandbox-info' });
	const timeline = h('ol', { id: 'timeline' });
	const travel = h('div', { id: 'travel', class: 'card travel', hidden: true });
	const executions = h('tbody', { id: 'executions' });
	const snapshots = h('div', { id: 'snapshots' });
	fill(main, h('p', {}, h('a', { href: '#/' }, '← Sandboxes')), head, info,
		h('h2', {}, 'Terminal'), terminalSection(id),
		h('h2', {}, 'Files'), await filesSection(id),
		canWrite() ? h('h2', {}, 'Environment') : null, canWrite() ? await envSection(id) : null,
		h('h2', {}, 'Executions'), canWrite() ? runForm(id) : null, h('div', { class: 'scroll' }, h('table', {}, h('thead', {}, h('tr', {}, h('th', {}, 'Execution'), h('th', {}, 'Status'), h('th', {}, 'Exit'), h('th', {}, 'Output'))), executions)),
		h('h2', {}, 'Snapshots and lineage'), snapshots,
		h('h2', {}, 'Checkpoints'), await checkpointsSection(id),
		h('h2', {}, 'Jobs'), await jobsSection(id),
		h('h2', {}, 'Timeline (pick an event to see the sandbox as of then)'), travel, timeline);

	async function refresh() {
		const sb = await api('GET', `/sandbox/${id}?includeDeleted=true`);
		const ended = ['terminated', 'failed', 'deleted'].includes(sb.status);
		fill(head, h('h1', {}, sb.name || id, ' ', badge(sb.status)),
			h('div', { class: 'row' },
				canWrite() && sb.status === 'paused' ? h('button', { id: 'resume', onclick: act(async () => { await api('POST', `/sandbox/${id}/resume`); await refresh(); }) }, 'Resume') : null,
				canWrite() && ['idle', 'running'].includes(sb.status) ? h('button', { class: 'plain', id: 'pause', onclick: act(async () => { await api('POST', `/sandbox/${id}/pause`); await refresh(); }) }, 'Pause') : null,
				canWrite() && !ended ? h('button', { class: 'plain', id: 'snapshot', onclick: act(async () => {
					const name = prompt('Snapshot name', 'web');
					if (name === null) return;
					await api('POST', `/sandbox/${id}/snapshot`, { name });
					await refreshSnapshots();
				}) }, 'Snapshot') : null,
				canWrite() && !ended ? h('button', { class: 'danger', id: 'destroy', onclick: act(async () => { await api('DELETE', `/sandbox/${id}`); await refresh(); }) }, 'Destroy') : null,
				sb.url ? h('a', { href: sb.url, target: '_blank', rel: 'noopener' }, 'Port URL') : null));
		fill(info, h('table', {}, h('tbody', {},
			[['Sandbox', id], ['Runtime', runtimeCell(sb.runtime)], ['Created', when(sb.createdAt)],
				['Memory', sb.resources && sb.resources.memory], ['CPU', sb.resources && sb.resources.cpu],
				['Network', sb.networkEnabled ? 'on' : 'off'], ['Executions', sb.executions]]
				.filter(([, v]) => v !== undefined && v !== null && v !== '')
				.map(([k, v]) => h('tr', {}, h('th', {}, k), h('td', {}, v))))));
		const steps = (await api('GET', `/sandbox/sandboxes/${id}/history`)).history;
		fill(timeline, ...steps.map((s) => h('li', {},
			h('button', { class: 'plain', 'data-event': s.eventId, 'data-type': s.type, onclick: act(() => showAsOf(s.eventId)) },
				`${when(s.createdAt)} ${s.type} → ${s.status}`))));
		const ex = await api('GET', `/sandbox/sandboxes/${id}/executions?limit=20`);
		fill(executions, ...ex.executions.map((e) => h('tr', {}, h('td', { class: 'mono' }, e.executionId), h('td', {}, badge(e.status)),
			h('td', {}, e.exitCode ?? ''), h('td', {}, e.stdoutStreamUrl ? h('a', { href: e.stdoutStreamUrl, target: '_blank', rel: 'noopener' }, 'stdout') : ''))));
	}
	async function showAsOf(eventId) {
		const then = await api('GET', `/sandbox/${id}?asOf=${encodeURIComponent(eventId)}`);
		travel.hidden = false;
		fill(travel, h('h3', {}, `As of ${then.asOf.type} (${when(then.asOf.createdAt)})`),
			h('p', {}, 'Status then: ', badge(then.status), ` · executions: ${then.executions}`),
			h('table', { id: 'travel-env' }, h('tbody', {}, Object.entries(then.env || {}).map(([k, v]) => h('tr', {}, h('th', {}, k), h('td', { class: 'mono' }, v))))),
			h('button', { class: 'plain', onclick: () => { travel.hidden = true; } }, 'Back to now'));
		for (const li of timeline.children) li.classList.toggle('selected', li.firstChild.dataset.event === eventId);
	}
	async function refreshSnapshots() {
		const snaps = (await api('GET', `/sandbox/snapshots?sandboxId=${id}`)).snapshots;
		if (!snaps.length) return fill(snapshots, h('p', {}, 'No snapshots of this sandbox.'));
		const lineage = (await api('GET', `/sandbox/snapshots/lineage?snapshot=${snaps[0].snapshotId}`)).lineage;
		fill(snapshots, h('ul', {}, snaps.map((s) => h('li', { class: 'mono' }, `${s.snapshotId} ${s.name || ''}${s.tag ? ':' + s.tag : ''} ${bytes(s.sizeBytes)}`))),
			lineageGraph(lineage));
	}
	onLive = debounce((ev) => { if (ev.sandboxId === id) refresh().catch(showError); }, 150);
	await refresh();
	await refreshSnapshots();
}

// Run a command and show its output as it arrives (the execution's stream URLs).
function runForm(id) {
	const cmd = h('input', { id: 'run-command', size: 50, placeholder: "python3 -c 'print(6*7)'" });
	const out = h('pre', { id: 'run-output', hidden: true });
	return h('form', { class: 'row', id: 'run', onsubmit: act(async () => {
		const ex = await api('POST', `/sandbox/${id}/execute`, { command: ['sh', '-c', cmd.value] });
		out.hidden = false;
		out.textContent = '';
		const follow = async (url) => {
			const resp = await fetch(url);
			const reader = resp.body.getReader();
			const dec = new TextDecoder();
			for (;;) {
				const { done, value } = await reader.read();
				if (done) break;
				out.textContent += dec.decode(value, { stream: true });
			}
		};
		await Promise.all([follow(ex.stdoutStreamUrl), follow(ex.stderrStreamUrl)]);
		const final = await api('GET', `/sandbox/execution/${ex.executionId}?wait=30s`);
		out.textContent += `\n[exit ${final.exitCode ?? final.status}]`;
	}) }, h('label', {}, 'Run a command', cmd), h('button', { type: 'submit' }, 'Run'), out);
}

async function jobsSection(id) {
	const list = h('tbody', { id: 'jobs' });
	async function load() {
		const got = await api('GET', `/sandbox/sandboxes/${id}/jobs`);
		fill(list, ...(got.jobs || []).map((j) => h('tr', {}, h('td', { class: 'mono' }, j.jobId),
			h('td', {}, (j.command || []).join(' ')), h('td', {}, badge(j.status)),
			h('td', {}, j.stdoutStreamUrl ? h('a', { href: j.stdoutStreamUrl, target: '_blank', rel: 'noopener' }, 'stdout') : ''),
			h('td', {}, canWrite() && ['running', 'pending'].includes(j.status) ? h('button', { class: 'plain', onclick: act(async () => { await api('DELETE', `/sandbox/sandboxes/${id}/jobs/${j.jobId}`); await load(); }) }, 'Stop') : ''))));
		if (!list.children.length) fill(list, h('tr', {}, h('td', {}, 'No jobs.')));
	}
	try {
		await load();
	} catch (err) {
		fill(list, h('tr', {}, h('td', {}, err.message)));
	}
	return h('div', { class: 'scroll' }, h('table', {}, list));
}

function terminalSection(id) {
	const box = h('div', { class: 'terminal', id: 'terminal', hidden: true });
	const open = h('button', { id: 'open-terminal', hidden: !canWrite(), onclick: act(async () => {
		open.hidden = true;
		box.hidden = false;
		const term = new Terminal({ cursorBlink: true, fontSize: 14, convertEol: false });
		term.open(box);
		const rows = Math.max(5, Math.floor((box.clientHeight - 8) / 17));
		const cols = Math.max(20, Math.floor((box.clientWidth - 8) / 8.4));
		term.resize(cols, rows);
		const proto = location.protocol === 'https:' ? 'wss' : 'ws';
		const ws = new WebSocket(`${proto}://${location.host}/sandbox/${id}/terminal?rows=${rows}&cols=${cols}`);
		ws.binaryType = 'arraybuffer';
		const enc = new TextEncoder();
		ws.onmessage = (m) => {
			if (typeof m.data === 'string') {
				const msg = JSON.parse(m.data);
				if (msg.type === 'exit') term.write(`\r\n[exited ${msg.exitCode}]\r\n`);
				else if (msg.type === 'error') showError(msg.message);
			} else term.write(new Uint8Array(m.data));
		};
		ws.onclose = () => term.write('\r\n[disconnected]\r\n');
		ws.onerror = () => showError('the terminal connection failed');
		term.onData((d) => { if (ws.readyState === 1) ws.send(enc.encode(d)); });
		window.hutchTerminal = term; // for the browser tests: what the screen shows
		term.focus();
	}) }, 'Open terminal');
	return h('div', {}, canWrite() ? open : h('p', {}, 'A read-only key cannot open a terminal.'), box);
}

async function filesSection(id) {
	let path = '/home/agentuity';
	const where = h('input', { id: 'files-path', value: path, size: 40 });
	const list = h('tbody', { id: 'files' });
	const view = h('pre', { id: 'file-view', hidden: true });
	const upload = h('input', { type: 'file', id: 'upload', multiple: true, hidden: !canWrite() });
	async function load(p) {
		path = p;
		where.value = p;
		const got = await api('GET', `/fs/list/${id}?path=${encodeURIComponent(p)}`);
		fill(list, 
			p !== '/' ? h('tr', {}, h('td', {}, h('a', { href: '#', onclick: act(() => load(p.replace(/\/[^/]+\/?$/, '') || '/')) }, '..')), h('td', {}), h('td', {})) : null,
			...got.files.map((f) => {
				const full = `${p.replace(/\/$/, '')}/${f.path}`;
				return h('tr', { dataset: { name: f.path } },
					h('td', {}, f.isDir ? h('a', { href: '#', onclick: act(() => load(full)) }, f.path + '/')
						: h('a', { href: '#', onclick: act(async () => {
							const resp = await api('GET', `/fs/${id}?path=${encodeURIComponent(full)}`, undefined, { raw: true });
							view.hidden = false;
							view.textContent = (await resp.text()).slice(0, 200000);
						}) }, f.path)),
					h('td', {}, f.isDir ? '' : bytes(f.size)),
					h('td', {}, canWrite() ? h('button', { class: 'plain', onclick: act(async () => {
						await api('POST', `/fs/${f.isDir ? 'rmdir' : 'rm'}/${id}`, { path: full, recursive: true });
						await load(p);
					}) }, 'Delete') : ''));
			}));
	}
	upload.addEventListener('change', act(async () => {
		for (const file of upload.files) {
			if (/\.(tar\.gz|tgz|zip|tar)$/.test(file.name)) {
				const fmt = file.name.endsWith('.zip') ? 'zip' : file.name.endsWith('.tar') ? 'tar' : 'tar.gz';
				await api('POST', `/fs/upload/${id}?path=${encodeURIComponent(path)}&format=${fmt}`, file);
			} else {
				const b64 = await toBase64(file);
				await api('POST', `/fs/${id}`, { files: [{ path: `${path.replace(/\/$/, '')}/${file.name}`, content: b64 }] });
			}
		}
		upload.value = '';
		await load(path);
	}));
	const mkdir = h('button', { class: 'plain', hidden: !canWrite(), onclick: act(async () => {
		const name = prompt('New directory name');
		if (!name) return;
		await api('POST', `/fs/mkdir/${id}`, { path: `${path.replace(/\/$/, '')}/${name}`, recursive: true });
		await load(path);
	}) }, 'New directory');
	const download = (fmt) => h('a', { href: '#', onclick: act(() => { location.href = `/fs/download/${id}?path=${encodeURIComponent(path)}&format=${fmt}`; }) }, `Download ${fmt}`);
	try {
		await load(path);
	} catch (err) {
		fill(list, h('tr', {}, h('td', {}, err.message)));
	}
	return h('div', {}, h('div', { class: 'row' }, h('label', {}, 'Path', where), h('button', { class: 'plain', onclick: act(() => load(where.value)) }, 'Go'),
		canWrite() ? h('label', {}, 'Upload files or archives', upload) : null, mkdir, download('tar.gz'), download('zip')),
	h('div', { class: 'scroll' }, h('table', {}, list)), view);
}

function toBase64(file) {
	return new Promise((resolve, reject) => {
		const r = new FileReader();
		r.onload = () => resolve(String(r.result).split(',', 2)[1] || '');
		r.onerror = () => reject(r.error);
		r.readAsDataURL(file);
	});
}

async function envSection(id) {
	const rows = h('tbody', { id: 'env' });
	let current = {};
	async function load() {
		current = (await api('PATCH', `/sandbox/env/${id}`, { env: {} })).env; // an empty change reads it
		fill(rows, ...Object.entries(current).map(([k, v]) => row(k, v)), row('', ''));
	}
	const row = (k, v) => h('tr', {}, h('td', {}, h('input', { class: 'env-key', value: k, placeholder: 'KEY' })),
		h('td', {}, h('input', { class: 'env-value', value: v, placeholder: 'value' })));
	const save = h('button', { id: 'save-env', onclick: act(async () => {
		const next = {};
		for (const tr of rows.children) {
			const k = $('.env-key', tr).value.trim();
			if (k) next[k] = $('.env-value', tr).value;
		}
		const change = { ...next };
		for (const k of Object.keys(current)) if (!(k in next)) change[k] = null;
		await api('PATCH', `/sandbox/env/${id}`, { env: change });
		await load();
	}) }, 'Save env');
	try {
		await load();
	} catch (err) {
		fill(rows, h('tr', {}, h('td', {}, err.message)));
	}
	return h('div', {}, h('table', {}, rows), save);
}

async function checkpointsSection(id) {
	const list = h('ul', { id: 'checkpoints' });
	async function load() {
		let got;
		try {
			got = await api('GET', `/sandbox/checkpoints/${id}`);
		} catch (err) {
			return fill(list, h('li', {}, err.message));
		}
		fill(list, ...(got.checkpoints || []).map((c) => h('li', {}, `${c.name || c.id} (${when(c.createdAt)}) `,
			canWrite() ? h('button', { class: 'plain', onclick: act(async () => { await api('POST', `/sandbox/${id}/checkpoint/${c.id}/restore`); }) }, 'Restore') : null,
			canWrite() ? h('button', { class: 'plain', onclick: act(async () => { await api('DELETE', `/sandbox/${id}/checkpoint/${c.id}`); await load(); }) }, 'Delete') : null)));
	}
	await load();
	return h('div', {}, list, canWrite() ? h('button', { class: 'plain', onclick: act(async () => {
		const name = prompt('Checkpoint name', 'cp');
		if (name === null) return;
		await api('POST', `/sandbox/${id}/checkpoint`, { name });
		await load();
	}) }, 'Create checkpoint') : null);
}

// A lineage as a picture: each snapshot a box, an arrow from parent to child.
function lineageGraph(lineage) {
	const ns = 'http://www.w3.org/2000/svg';
	const chain = [...lineage].reverse(); // the API answers child first
	const w = 300, bh = 34, gap = 26;
	const svg = document.createElementNS(ns, 'svg');
	svg.setAttribute('viewBox', `0 0 ${w} ${chain.length * (bh + gap)}`);
	svg.setAttribute('width', String(w));
	svg.setAttribute('role', 'img');
	svg.setAttribute('aria-label', 'snapshot lineage');
	svg.id = 'lineage';
	chain.forEach((s, i) => {
		const y = i * (bh + gap);
		const rect = document.createElementNS(ns, 'rect');
		for (const [k, v] of Object.entries({ x: 2, y, width: w - 4, height: bh, rx: 5, fill: s.deleted ? '#eee' : '#e7f0fa', stroke: '#0b5cad' })) rect.setAttribute(k, v);
		const text = document.createElementNS(ns, 'text');
		text.setAttribute('x', '10');
		text.setAttribute('y', String(y + 21));
		text.textContent = `${s.name || ''}${s.tag ? ':' + s.tag : ''} ${s.snapshotId.slice(0, 14)}…${s.deleted ? ' (deleted)' : ''}`;
		svg.append(rect, text);
		if (i > 0) {
			const line = document.createElementNS(ns, 'line');
			for (const [k, v] of Object.entries({ x1: w / 2, y1: y - gap, x2: w / 2, y2: y, stroke: '#0b5cad', 'stroke-width': 2 })) line.setAttribute(k, v);
			svg.append(line);
		}
	});
	return svg;
}

// ------------------------------------------------------------------ the other pages

async function runtimesPage() {
	const got = (await api('GET', '/sandbox/runtimes')).runtimes;
	fill(main, h('h1', {}, 'Runtimes'), h('div', { class: 'cards' }, got.map((r) => h('div', { class: 'card', dataset: { runtime: r.name } },
		h('h2', {}, runtimeCell(r)), h('p', {}, r.description || ''),
		h('p', {}, (r.tags || []).map((t) => h('span', { class: 'badge' }, t)), ' '),
		h('p', {}, r.available ? `built here${r.sizeBytes ? ', ' + bytes(r.sizeBytes) : ''}` : 'built on its first use'),
		!r.available && canWrite() ? buildButton(r.name) : null,
		r.readme ? h('details', {}, h('summary', {}, 'Readme'), h('pre', {}, r.readme)) : null))));
	onLive = () => {};
}

// Build a runtime now, its steps shown as they happen (the answer is a stream of events).
function buildButton(name) {
	const log = h('pre', { class: 'build-log', hidden: true });
	const btn = h('button', { class: 'plain', onclick: act(async () => {
		btn.disabled = true;
		log.hidden = false;
		const resp = await api('POST', `/sandbox/runtimes/${encodeURIComponent(name)}/build`, undefined, { raw: true });
		const reader = resp.body.getReader();
		const dec = new TextDecoder();
		let buf = '';
		for (;;) {
			const { done, value } = await reader.read();
			if (done) break;
			buf += dec.decode(value, { stream: true });
			let cut;
			while ((cut = buf.indexOf('\n\n')) >= 0) {
				const msg = JSON.parse(buf.slice(0, cut).replace(/^data: /, ''));
				buf = buf.slice(cut + 2);
				if (msg.line) log.textContent += msg.line + '\n';
				if (msg.error) throw new ApiError(`building ${name}: ${msg.error}`);
				if (msg.done) log.textContent += 'built\n';
			}
		}
	}) }, 'Build now');
	return h('div', {}, btn, log);
}

async function snapshotsPage() {
	const got = (await api('GET', '/sandbox/snapshots?limit=100')).snapshots;
	const graph = h('div', { id: 'snapshot-lineage' });
	fill(main, h('h1', {}, 'Snapshots'), h('div', { class: 'scroll' }, h('table', {}, h('tbody', { id: 'snapshot-list' }, got.map((s) => h('tr', {},
		h('td', { class: 'mono' }, s.snapshotId), h('td', {}, `${s.name || ''}${s.tag ? ':' + s.tag : ''}`), h('td', {}, bytes(s.sizeBytes)),
		h('td', {}, s.public ? 'public' : 'private'),
		h('td', {}, h('button', { class: 'plain', onclick: act(async () => {
			fill(graph, lineageGraph((await api('GET', `/sandbox/snapshots/lineage?snapshot=${s.snapshotId}`)).lineage));
		}) }, 'Lineage'), ' ', h('a', { href: `/sandbox/snapshots/${s.snapshotId}/download` }, 'Download'), ' ',
		canWrite() ? h('button', { class: 'plain', onclick: act(async () => { const made = await api('POST', '/sandbox', { snapshot: s.snapshotId }); location.hash = `#/sandbox/${made.sandboxId}`; }) }, 'New sandbox') : null, ' ',
		canWrite() ? h('button', { class: 'danger', onclick: act(async () => { await api('DELETE', `/sandbox/snapshots/${s.snapshotId}`); await snapshotsPage(); }) }, 'Delete') : null)))))), graph);
	onLive = () => {};
}

async function usagePage(project = '') {
	const projects = (await api('GET', '/projects')).projects || [];
	const pick = h('select', { id: 'usage-project', onchange: act(() => usagePage(pick.value)) },
		h('option', { value: '' }, 'the whole organization'),
		projects.map((p) => h('option', { value: p.id, selected: p.id === project }, p.name)));
	const days = [];
	const now = new Date();
	for (let i = 6; i >= 0; i--) {
		const start = new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), now.getUTCDate() - i));
		const end = new Date(start.getTime() + 86400000);
		const q = new URLSearchParams({ start: start.toISOString(), end: end.toISOString(), ...(project && { projectId: project }) });
		const s = await api('GET', `/sandbox/stats?${q}`);
		days.push({ day: start.toISOString().slice(5, 10), s });
	}
	const chart = (title, pick) => {
		const values = days.map((d) => pick(d.s) || 0);
		const max = Math.max(1, ...values);
		const ns = 'http://www.w3.org/2000/svg';
		const svg = document.createElementNS(ns, 'svg');
		svg.setAttribute('viewBox', '0 0 350 140');
		svg.setAttribute('role', 'img');
		svg.setAttribute('aria-label', title);
		values.forEach((v, i) => {
			const bh = Math.round((v / max) * 85); // room above the tallest bar for its value
			const rect = document.createElementNS(ns, 'rect');
			for (const [k, val] of Object.entries({ x: 10 + i * 48, y: 110 - bh, width: 36, height: bh, fill: '#0b5cad' })) rect.setAttribute(k, val);
			const label = document.createElementNS(ns, 'text');
			label.setAttribute('x', String(10 + i * 48));
			label.setAttribute('y', '128');
			label.textContent = days[i].day;
			const val = document.createElementNS(ns, 'text');
			val.setAttribute('x', String(10 + i * 48));
			val.setAttribute('y', String(105 - bh));
			val.textContent = String(Math.round(v * 100) / 100);
			svg.append(rect, label, val);
		});
		return h('div', { class: 'card' }, h('h2', {}, title), svg);
	};
	fill(main, h('h1', {}, `Usage of ${me.orgId} (last 7 days, UTC)`), h('label', {}, 'Project', pick), h('div', { class: 'cards' },
		chart('Sandboxes created', (s) => s.sandboxes.created), chart('Executions', (s) => s.executions.total),
		chart('CPU seconds', (s) => s.cpu.seconds), chart('Memory GiB-seconds', (s) => s.memory.gibSeconds)));
	onLive = () => {};
}

async function keysPage() {
	if (me.role !== 'admin') {
		fill(main, h('h1', {}, 'Keys'), h('p', {}, 'Only an admin key manages keys.'));
		return;
	}
	const shown = h('div', { id: 'new-secret' });
	const role = h('select', { id: 'key-role' }, ['member', 'read-only', 'admin'].map((r) => h('option', { value: r }, r)));
	const name = h('input', { id: 'key-name', placeholder: 'name' });
	const rows = h('tbody', { id: 'keys' });
	async function load() {
		const got = (await api('GET', '/keys')).keys;
		fill(rows, ...got.map((k) => h('tr', {}, h('td', { class: 'mono' }, k.id), h('td', {}, k.name || ''), h('td', {}, k.role),
			h('td', {}, k.revokedAt ? `revoked ${when(k.revokedAt)}` : 'active'),
			h('td', {}, k.revokedAt ? '' : h('button', { class: 'danger', onclick: act(async () => { await api('DELETE', `/keys/${k.id}`); await load(); }) }, 'Revoke')))));
	}
	fill(main, h('h1', {}, 'API keys'),
		h('form', { class: 'grid', onsubmit: act(async () => {
			const made = await api('POST', '/keys', { role: role.value, ...(name.value && { name: name.value }) });
			fill(shown, h('p', { class: 'secret' }, 'Its secret, shown this once: ', h('code', {}, made.secret)));
			await load();
		}) }, h('label', {}, 'Role', role), h('label', {}, 'Name', name), h('button', { type: 'submit' }, 'Create key')),
		shown, h('div', { class: 'scroll' }, h('table', {}, rows)));
	await load();
	onLive = () => {};
}

// ------------------------------------------------------------------ routing

async function route() {
	clearError();
	if (!me) {
		try {
			me = await api('GET', '/app/session');
		} catch {
			me = null;
		}
	}
	if (!me) return signInPage();
	$('#top').hidden = false;
	$('#who').textContent = `${me.orgId} · ${me.role}`;
	$('#nav-keys').hidden = me.role !== 'admin';
	startLive();
	const hash = location.hash.replace(/^#/, '') || '/';
	const m = hash.match(/^\/sandbox\/([a-z0-9_]+)$/);
	try {
		if (m) await sandboxPage(m[1]);
		else if (hash === '/runtimes') await runtimesPage();
		else if (hash === '/snapshots') await snapshotsPage();
		else if (hash === '/usage') await usagePage();
		else if (hash === '/keys') await keysPage();
		else await sandboxesPage();
		main.focus();
	} catch (err) {
		showError(err);
	}
}

$('#sign-out').addEventListener('click', act(signOut));
window.addEventListener('hashchange', route);
route();
