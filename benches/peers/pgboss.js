// pg-boss: JOBS no-op jobs queued first (insert, 1,000 a call), then `concurrency`
// workers (one `work` loop each) run them, BATCH jobs a fetch (pg-boss's default is
// 1). A pg-boss worker waits out its polling interval (at least 0.5 s) after every
// fetch, so a worker runs at most 2 × BATCH jobs a second.
"use strict";
const PgBoss = require("pg-boss");
const { args, tally, drained, report } = require("./common");

async function main() {
  const { url, jobs, concurrency, batch } = args();
  const boss = new PgBoss({ connectionString: url, max: concurrency + 2 });
  boss.on("error", (e) => console.error(e));
  await boss.start();
  await boss.createQueue("noop");
  for (let i = 0; i < jobs; i += 1000) {
    const batch = [];
    for (let j = i; j < Math.min(jobs, i + 1000); j++) batch.push({ name: "noop", data: { n: j } });
    await boss.insert(batch);
  }
  const t = tally(jobs);
  const started = process.hrtime.bigint();
  for (let w = 0; w < concurrency; w++) {
    await boss.work("noop", { pollingIntervalSeconds: 0.5, batchSize: batch }, async (batch) => batch.forEach((job) => t.ran(job.data.n)));
  }
  await t.done;
  const sql = "SELECT count(*)::int AS n FROM pgboss.job WHERE name = 'noop' AND state <> 'completed'";
  const left = await drained(async () => (await boss.getDb().executeSql(sql, [])).rows[0].n);
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;
  await boss.offWork("noop");
  await boss.stop({ graceful: true, wait: true });
  report(`pg-boss 10.4.2, batch ${batch}`, jobs, concurrency, seconds, t.exactlyOnce(left));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
