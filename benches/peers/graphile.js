// graphile-worker with its defaults in one Node process: JOBS no-op jobs queued
// first (addJobs, 1,000 a call), then `concurrency` workers run them to the end.
// Only its per-job log lines are dropped (leasehold's bench logs none either).
"use strict";
const { run, makeWorkerUtils, Logger } = require("graphile-worker");
const { args, tally, drained, report } = require("./common");

async function main() {
  const { url, jobs, concurrency } = args();
  const logger = new Logger(() => (level, message) => level === "error" && console.error(message));
  const utils = await makeWorkerUtils({ connectionString: url, logger });
  await utils.migrate();
  for (let i = 0; i < jobs; i += 1000) {
    const specs = [];
    for (let j = i; j < Math.min(jobs, i + 1000); j++) specs.push({ identifier: "noop", payload: { n: j } });
    await utils.addJobs(specs);
  }
  const t = tally(jobs);
  const started = process.hrtime.bigint();
  const runner = await run({
    connectionString: url,
    concurrency,
    noHandleSignals: true,
    logger,
    taskList: { noop: async (payload) => t.ran(payload.n) },
  });
  await t.done;
  const count = () =>
    utils.withPgClient(async (c) => (await c.query("SELECT count(*)::int AS n FROM graphile_worker.jobs")).rows[0].n);
  const left = await drained(count);
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;
  await runner.stop();
  await utils.release();
  report("graphile-worker 0.17.3", jobs, concurrency, seconds, t.exactlyOnce(left));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
