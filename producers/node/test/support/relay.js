// The relay binary, run as a child process: $JOBRELAY_BIN, else
// ${CARGO_TARGET_DIR:-<repo>/target}/debug/jobrelay, built with cargo if missing.

import { execFileSync, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The repository's root (producers/node/test/support/ is four levels down). */
export const REPO = resolve(dirname(fileURLToPath(import.meta.url)), '../../../..');

let binary;

/** The relay binary's path, built first if it is missing. */
export function relayBinary() {
  if (binary) {
    return binary;
  }
  if (process.env.JOBRELAY_BIN) {
    binary = process.env.JOBRELAY_BIN;
    return binary;
  }
  const target = process.env.CARGO_TARGET_DIR || join(REPO, 'target');
  binary = join(target, 'debug', 'jobrelay');
  if (!existsSync(binary)) {
    execFileSync('cargo', ['build', '--bin', 'jobrelay'], { cwd: REPO, stdio: 'inherit' });
  }
  return binary;
}

/** Runs `jobrelay ARGS...` to its end; returns its stdout, throws with its stderr. */
export function runRelay(args, env) {
  return execFileSync(relayBinary(), args, {
    env: { ...process.env, ...env },
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'pipe'],
  });
}

/**
 * Starts the relay daemon on `databaseUrl` with --layout bullmq, `namespace` and `table`.
 * @returns {{ stop(): Promise<void>, log(): string }}
 */
export function startRelay(databaseUrl, namespace, table = 'pending_jobs') {
  const child = spawn(
    relayBinary(),
    [
      ...['--layout', 'bullmq', '--namespace', namespace, '--table', table],
      ...['--http-addr', 'off', '--log-format', 'json'],
    ],
    {
      env: { ...process.env, DATABASE_URL: databaseUrl, REDIS_URL: 'redis://127.0.0.1:6379' },
      stdio: ['ignore', 'pipe', 'pipe'],
    },
  );
  let log = '';
  child.stdout.on('data', (d) => (log += d));
  child.stderr.on('data', (d) => (log += d));
  let stopping = false;
  const exited = new Promise((done) => child.once('exit', done));
  // A relay that dies under a test would only show as a timeout: say so, with its log.
  exited.then((code) => {
    if (!stopping) {
      process.stderr.write(`the relay exited (${code}) during the tests; its log:\n${log}\n`);
    }
  });
  return {
    log: () => log,
    async stop() {
      stopping = true;
      if (child.exitCode === null) {
        child.kill('SIGTERM');
      }
      await exited;
    },
  };
}
