// The transactional lifecycle through a TypeScript client generated from the OpenAPI
// documents (@hey-api/openapi-ts). The test copies this file next to the generated
// `coordinator/` and `node/` clients, type-checks it with tsc and runs it with Node.js.
// Usage: tsx lifecycle.ts <coordinator-url>

import { createClient, createConfig } from './coordinator/client';
import {
  abortTransaction,
  addPartitionsToTxn,
  commitTransaction,
  createTopic,
  initTransactions,
} from './coordinator/sdk.gen';
import type { ErrorEnvelope, ProducerIdResponse } from './coordinator/types.gen';
import { createClient as createNodeClient, createConfig as createNodeConfig } from './node/client';
import { fetchRecords, produceRecords } from './node/sdk.gen';
import type { ErrorEnvelope as NodeErrorEnvelope, FetchResponse } from './node/types.gen';

function check(condition: boolean, what: string): asserts condition {
  if (!condition) {
    throw new Error(`check failed: ${what}`);
  }
}

function expectOk<T>(result: { data?: T; error?: unknown; response?: Response }, what: string): T {
  if (result.error !== undefined || result.data === undefined) {
    throw new Error(`${what}: ${result.response?.status} ${JSON.stringify(result.error)}`);
  }
  return result.data;
}

const coordinatorUrl = process.argv[2];
check(coordinatorUrl !== undefined, 'coordinator URL given');
const coordinator = createClient(createConfig({ baseUrl: coordinatorUrl }));
const suffix = Math.random().toString(16).slice(2, 10);
const topic = `ts-${suffix}`;
const tid = `ts-txn-${suffix}`;

const created = expectOk(
  await createTopic({ client: coordinator, body: { name: topic, partitions: 1 } }),
  'createTopic',
);
const storage = createNodeClient(createNodeConfig({ baseUrl: created.partitions[0].leader.url }));

const ids: ProducerIdResponse = expectOk(
  await initTransactions({
    client: coordinator,
    path: { tid },
    body: { transaction_timeout_ms: 60000 },
  }),
  'initTransactions',
);
const { producer_id, producer_epoch } = ids;
let sequence = 0;

async function transaction(values: string[], commit: boolean): Promise<void> {
  const added = expectOk(
    await addPartitionsToTxn({
      client: coordinator,
      path: { tid },
      body: { producer_id, producer_epoch, partitions: [{ topic, partition: 0 }] },
    }),
    'addPartitionsToTxn',
  );
  check(added.partitions.every((p) => p.error === null), 'partition added');
  const written = expectOk(
    await produceRecords({
      client: storage,
      path: { topic, partition: 0 },
      body: {
        producer_id,
        producer_epoch,
        base_sequence: sequence,
        transactional: true,
        records: values.map((value, i) => ({ key: `k${i}`, value })),
      },
    }),
    'produceRecords',
  );
  check(!written.duplicate, 'not a duplicate');
  sequence += values.length;
  const end = commit ? commitTransaction : abortTransaction;
  const ended = expectOk(
    await end({
      client: coordinator,
      path: { tid },
      body: { producer_id, producer_epoch, wait_for_markers: true },
    }),
    commit ? 'commitTransaction' : 'abortTransaction',
  );
  check(ended.transactional_id === tid, 'ended the right transaction');
}

await transaction(['committed-1', 'committed-2'], true);
await transaction(['aborted-1'], false);

const page: FetchResponse = expectOk(
  await fetchRecords({
    client: storage,
    path: { topic, partition: 0 },
    query: { isolation_level: 'read_committed' },
  }),
  'fetchRecords',
);
const seen = page.records.map((r) => r.value);
check(JSON.stringify(seen) === JSON.stringify(['committed-1', 'committed-2']), `read_committed saw ${seen}`);

// A second producer with the same transactional id fences the first.
const newer = expectOk(
  await initTransactions({ client: coordinator, path: { tid }, body: { transaction_timeout_ms: 60000 } }),
  'initTransactions (second producer)',
);
check(newer.producer_epoch > producer_epoch, 'epoch bumped');
const fenced = await addPartitionsToTxn({
  client: coordinator,
  path: { tid },
  body: { producer_id, producer_epoch, partitions: [{ topic, partition: 0 }] },
});
check(fenced.response?.status === 409, `fenced answers 409, got ${fenced.response?.status}`);
const envelope: ErrorEnvelope | undefined = fenced.error;
check(envelope !== undefined && envelope.error.code === 'PRODUCER_FENCED', 'PRODUCER_FENCED');
check(envelope.error.retriable === false, 'fencing is not retriable');
const stale = await produceRecords({
  client: storage,
  path: { topic, partition: 0 },
  body: {
    producer_id,
    producer_epoch,
    base_sequence: sequence,
    transactional: true,
    records: [{ key: 'k', value: 'late' }],
  },
});
const nodeEnvelope: NodeErrorEnvelope | undefined = stale.error;
check(stale.response?.status === 409 && nodeEnvelope !== undefined, 'stale produce refused');
check(
  ['PRODUCER_FENCED', 'INVALID_PRODUCER_EPOCH'].includes(nodeEnvelope.error.code),
  `stale produce code ${nodeEnvelope.error.code}`,
);

console.log(JSON.stringify({ ok: true, topic, tid, committed: seen, fenced: envelope.error.code }));
