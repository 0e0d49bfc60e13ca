// A consumer group (KIP-848 over HTTP) through the TypeScript clients generated from the
// OpenAPI documents (@hey-api/openapi-ts). The test copies this file next to the generated
// `coordinator/` and `node/` clients, type-checks it with tsc and runs it with Node.js.
// Usage: tsx group.ts <coordinator-url>
//
// Member "a" joins alone and is given all four partitions, reads every record produced and
// commits its offsets. Member "b" joins: a's assignment shrinks to two, b is given those two
// only after a has let go of them (reported them no longer owned), and no partition is ever
// held by both. b resumes from a's committed offsets. Both leave; a's old epoch is then
// UNKNOWN_MEMBER_ID. Progress goes to stderr, the outcome (one JSON line) to stdout.

import { createClient, createConfig } from './coordinator/client';
import {
  allocateProducerId,
  consumerGroupHeartbeat,
  createTopic,
  describeGroup,
  describeTopic,
  findCoordinator,
} from './coordinator/sdk.gen';
import type {
  ErrorEnvelope,
  GroupDescription,
  GroupHeartbeatResponse,
  TopicPartition,
} from './coordinator/types.gen';
import { createClient as createNodeClient, createConfig as createNodeConfig } from './node/client';
import {
  commitGroupOffsets,
  fetchGroupOffsets,
  fetchRecords,
  produceRecords,
} from './node/sdk.gen';
import type { CommittedOffset } from './node/types.gen';

type NodeClient = ReturnType<typeof createNodeClient>;
type Outcome<T> = { data?: T; error?: unknown; response?: Response };

const PARTITIONS = 4;
const RECORDS_PER_PARTITION = 3;
const DEADLINE_MS = 30_000;
/** What a storage node may answer while its metadata catches up (design.md §4, Errors). */
const NODE_RETRY = ['UNKNOWN_TOPIC_OR_PARTITION'];

// ---------------------------------------------------------------------------- helpers

function check(condition: boolean, what: string): asserts condition {
  if (!condition) {
    throw new Error(`check failed: ${what}`);
  }
}

function log(message: string): void {
  console.error(`[group.ts] ${message}`);
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function expectOk<T>(result: Outcome<T>, what: string): T {
  if (result.error !== undefined || result.data === undefined) {
    throw new Error(`${what}: ${result.response?.status} ${JSON.stringify(result.error)}`);
  }
  return result.data;
}

function envelopeOf(error: unknown): ErrorEnvelope | undefined {
  if (typeof error !== 'object' || error === null || !('error' in error)) {
    return undefined;
  }
  return error as ErrorEnvelope;
}

/** The call's answer, retrying retriable errors (and `alsoRetry` codes) until the deadline. */
async function retrying<T>(
  what: string,
  call: () => Promise<Outcome<T>>,
  alsoRetry: string[] = [],
): Promise<T> {
  const deadline = Date.now() + DEADLINE_MS;
  for (;;) {
    const result = await call();
    const envelope = envelopeOf(result.error);
    const again =
      envelope !== undefined && (envelope.error.retriable || alsoRetry.includes(envelope.error.code));
    if (!again || Date.now() > deadline) {
      return expectOk(result, what);
    }
    log(`${what}: ${envelope.error.code}, retrying`);
    await sleep(200);
  }
}

const key = (tp: TopicPartition): string => `${tp.topic}/${tp.partition}`;
const keys = (tps: TopicPartition[]): string[] => tps.map(key).sort();
const sameSet = (a: TopicPartition[], b: TopicPartition[]): boolean =>
  JSON.stringify(keys(a)) === JSON.stringify(keys(b));
const minus = (a: TopicPartition[], b: TopicPartition[]): TopicPartition[] =>
  a.filter((tp) => !keys(b).includes(key(tp)));
const union = (a: TopicPartition[], b: TopicPartition[]): TopicPartition[] => [...a, ...minus(b, a)];
const partitionsOf = (tps: TopicPartition[]): number[] => tps.map((tp) => tp.partition).sort();

// ---------------------------------------------------------------------------- cluster

const coordinatorUrl = process.argv[2];
check(coordinatorUrl !== undefined, 'coordinator URL given');
const coordinator = createClient(createConfig({ baseUrl: coordinatorUrl }));
const suffix = Math.random().toString(16).slice(2, 10);
const topic = `ts-group-${suffix}`;
const group = `ts-group-${suffix}`;

const nodeClients = new Map<string, NodeClient>();

function nodeAt(url: string): NodeClient {
  let client = nodeClients.get(url);
  if (client === undefined) {
    client = createNodeClient(createNodeConfig({ baseUrl: url }));
    nodeClients.set(url, client);
  }
  return client;
}

/** The storage node leading the partition now (asked every time: leaders may move). */
async function leaderOf(partition: number): Promise<NodeClient> {
  const described = expectOk(
    await describeTopic({ client: coordinator, path: { topic } }),
    'describeTopic',
  );
  const info = described.partitions.find((p) => p.partition === partition);
  check(info !== undefined, `partition ${partition} described`);
  return nodeAt(info.leader.url);
}

/** The storage node holding the group's committed offsets (FindCoordinator, key_type group). */
async function offsetsNode(): Promise<NodeClient> {
  const found = expectOk(
    await findCoordinator({ client: coordinator, query: { key: group, key_type: 'group' } }),
    'findCoordinator',
  );
  check(found.key_type === 'group' && found.key === group, 'found the group\'s offsets node');
  return nodeAt(found.url);
}

// ---------------------------------------------------------------------------- records

const producer = expectOk(
  await allocateProducerId({ client: coordinator, body: {} }),
  'allocateProducerId',
);
const sequences = new Map<number, number>();

/** Appends the values to the partition as an idempotent batch (a retry is a duplicate). */
async function produce(partition: number, values: string[]): Promise<void> {
  const base_sequence = sequences.get(partition) ?? 0;
  const written = await retrying(
    `produceRecords ${partition}`,
    async () =>
      produceRecords({
        client: await leaderOf(partition),
        path: { topic, partition },
        body: {
          producer_id: producer.producer_id,
          producer_epoch: producer.producer_epoch,
          base_sequence,
          records: values.map((value) => ({ key: `p${partition}`, value })),
        },
      }),
    NODE_RETRY,
  );
  check(written.last_offset - written.base_offset === values.length - 1, 'one offset a record');
  sequences.set(partition, base_sequence + values.length);
}

/** Reads `count` records of the partition from `offset`; the offset to go on from. */
async function read(partition: number, offset: number, count: number): Promise<{ values: string[]; next: number }> {
  const values: string[] = [];
  let position = offset;
  const deadline = Date.now() + DEADLINE_MS;
  while (values.length < count) {
    check(Date.now() < deadline, `partition ${partition}: ${values.length} of ${count} records read`);
    const page = await retrying(
      `fetchRecords ${partition}`,
      async () =>
        fetchRecords({
          client: await leaderOf(partition),
          path: { topic, partition },
          query: { offset: position, max_wait_ms: 200 },
        }),
      NODE_RETRY,
    );
    values.push(...page.records.map((r) => r.value ?? ''));
    position = page.next_offset;
  }
  return { values, next: position };
}

/** Commits the group's offsets (the next offset to read) for the partitions at `positions`. */
async function commit(partitions: number[], positions: Map<number, number>): Promise<void> {
  const offsets = partitions.map((partition) => ({
    topic,
    partition,
    offset: positions.get(partition) ?? 0,
  }));
  const committed = await retrying('commitGroupOffsets', async () =>
    commitGroupOffsets({ client: await offsetsNode(), path: { group_id: group }, body: { offsets } }),
  NODE_RETRY);
  check(committed.offsets.length === offsets.length, 'every offset committed');
}

/** The group's committed offsets on this topic, by partition. */
async function committedOffsets(): Promise<Map<number, number>> {
  const fetched = await retrying('fetchGroupOffsets', async () =>
    fetchGroupOffsets({ client: await offsetsNode(), path: { group_id: group } }),
  NODE_RETRY);
  const ours = fetched.offsets.filter((o: CommittedOffset) => o.topic === topic);
  return new Map(ours.map((o) => [o.partition, o.offset]));
}

// ---------------------------------------------------------------------------- members

/** One member as a client keeps it: its id and epoch, the assignment of its last answer
 * (what it reads) and the `owned_partitions` it last reported. */
interface Member {
  name: string;
  id: string;
  epoch: number;
  assignment: TopicPartition[];
  reported: TopicPartition[];
}

const members: Member[] = [];

/** No partition is assigned to, or still reported owned by, two members. */
function checkNoOverlap(): void {
  for (const [i, m] of members.entries()) {
    for (const other of members.slice(i + 1)) {
      const shared = keys(union(m.assignment, m.reported)).filter((k) =>
        keys(union(other.assignment, other.reported)).includes(k),
      );
      check(shared.length === 0, `${m.name} and ${other.name} both hold ${shared}`);
    }
  }
}

function heard(member: Member, answer: GroupHeartbeatResponse): void {
  member.id = answer.member_id;
  member.epoch = answer.member_epoch;
  member.assignment = answer.assignment;
  log(`${member.name}: epoch ${member.epoch}, assignment [${partitionsOf(member.assignment)}]`);
  checkNoOverlap();
}

async function join(name: string): Promise<Member> {
  const answer = await retrying(`join ${name}`, async () =>
    consumerGroupHeartbeat({
      client: coordinator,
      path: { group_id: group },
      body: { member_epoch: 0, subscribed_topic_names: [topic], owned_partitions: [] },
    }),
  );
  check(answer.member_epoch > 0, `${name} joined with an epoch`);
  const member: Member = { name, id: answer.member_id, epoch: 0, assignment: [], reported: [] };
  members.push(member);
  heard(member, answer);
  return member;
}

/** One heartbeat: the member reads what its last answer assigned and reports just that. */
async function beat(member: Member, maxWaitMs = 0): Promise<void> {
  const owned = member.assignment;
  const answer = await retrying(`heartbeat ${member.name}`, async () =>
    consumerGroupHeartbeat({
      client: coordinator,
      path: { group_id: group },
      body: {
        member_id: member.id,
        member_epoch: member.epoch,
        owned_partitions: owned,
        max_wait_ms: maxWaitMs,
      },
    }),
  );
  member.reported = owned;
  heard(member, answer);
}

/** Heartbeats (long-polling) until `done` holds for the member. */
async function beatUntil(member: Member, done: (m: Member) => boolean, what: string): Promise<void> {
  const deadline = Date.now() + DEADLINE_MS;
  while (!done(member)) {
    check(Date.now() < deadline, `${what} within ${DEADLINE_MS} ms`);
    await beat(member, 500);
  }
}

async function leave(member: Member): Promise<void> {
  const answer = expectOk(
    await consumerGroupHeartbeat({
      client: coordinator,
      path: { group_id: group },
      body: { member_id: member.id, member_epoch: -1 },
    }),
    `leave ${member.name}`,
  );
  check(answer.member_epoch === -1 && answer.assignment.length === 0, `${member.name} left`);
  members.splice(members.indexOf(member), 1);
}

async function describe(): Promise<GroupDescription> {
  return expectOk(
    await describeGroup({ client: coordinator, path: { group_id: group } }),
    'describeGroup',
  );
}

// ---------------------------------------------------------------------------- 1. records

const created = expectOk(
  await createTopic({ client: coordinator, body: { name: topic, partitions: PARTITIONS } }),
  'createTopic',
);
check(created.partitions.length === PARTITIONS, `${PARTITIONS} partitions`);
const produced = new Map<number, string[]>();
for (let partition = 0; partition < PARTITIONS; partition++) {
  const values = Array.from({ length: RECORDS_PER_PARTITION }, (_, i) => `p${partition}-r${i}`);
  await produce(partition, values);
  produced.set(partition, values);
}
log(`produced ${RECORDS_PER_PARTITION} records into each of ${PARTITIONS} partitions of ${topic}`);

// ---------------------------------------------------------------------------- 2. one member

const a = await join('a');
await beatUntil(a, (m) => m.assignment.length === PARTITIONS, 'a is given every partition');
const positions = new Map<number, number>();
for (const partition of partitionsOf(a.assignment)) {
  const { values, next } = await read(partition, 0, RECORDS_PER_PARTITION);
  check(
    JSON.stringify(values) === JSON.stringify(produced.get(partition)),
    `partition ${partition} read ${values}`,
  );
  positions.set(partition, next);
}
await commit(partitionsOf(a.assignment), positions);
const firstCommit = await committedOffsets();
for (const partition of partitionsOf(a.assignment)) {
  check(
    firstCommit.get(partition) === positions.get(partition),
    `partition ${partition} committed at ${firstCommit.get(partition)}`,
  );
}
log(`a read and committed ${[...firstCommit].map(([p, o]) => `${p}@${o}`).join(', ')}`);

// ---------------------------------------------------------------------------- 3. a second member

const b = await join('b');
check(b.assignment.length === 0, 'b is given nothing a still holds');
await beatUntil(a, (m) => m.assignment.length === PARTITIONS / 2, 'a\'s assignment shrinks');
const revoked = minus(a.reported, a.assignment);
check(revoked.length === PARTITIONS / 2, `a must let go of ${partitionsOf(revoked)}`);
await beat(b);
check(b.assignment.length === 0, 'b is given nothing before a lets go');
// a commits what it read of the revoked partitions, stops reading them and says so.
await commit(partitionsOf(revoked), positions);
await beat(a);
check(sameSet(a.reported, a.assignment), 'a reports only what it keeps');
await beatUntil(b, (m) => m.assignment.length === PARTITIONS / 2, 'b is given a\'s revoked partitions');
check(sameSet(b.assignment, revoked), `b holds a's revoked ${partitionsOf(revoked)}`);

// b starts where a committed; each member reads a new record of each partition it holds.
const handedOver = await committedOffsets();
for (const tp of b.assignment) {
  check(
    handedOver.get(tp.partition) === positions.get(tp.partition),
    `b resumes partition ${tp.partition} at a's commit`,
  );
}
for (let partition = 0; partition < PARTITIONS; partition++) {
  await produce(partition, [`p${partition}-late`]);
}
for (const member of [a, b]) {
  for (const partition of partitionsOf(member.assignment)) {
    const from = member === a ? positions.get(partition) : handedOver.get(partition);
    const { values, next } = await read(partition, from ?? 0, 1);
    check(values.length === 1 && values[0] === `p${partition}-late`, `${member.name} read ${values}`);
    positions.set(partition, next);
  }
  await commit(partitionsOf(member.assignment), positions);
}
const finalCommit = await committedOffsets();
for (let partition = 0; partition < PARTITIONS; partition++) {
  check(
    finalCommit.get(partition) === RECORDS_PER_PARTITION + 1,
    `partition ${partition} committed at ${finalCommit.get(partition)}`,
  );
}

// ---------------------------------------------------------------------------- 4. stable, leave

let description = await describe();
const deadline = Date.now() + DEADLINE_MS;
while (description.state !== 'stable') {
  check(Date.now() < deadline, `group stable (still ${description.state})`);
  await beat(a);
  await beat(b);
  description = await describe();
}
check(description.members.length === 2, `2 members, got ${description.members.length}`);
for (const member of [a, b]) {
  const described = description.members.find((m) => m.member_id === member.id);
  check(described !== undefined, `${member.name} described`);
  check(described.state === 'stable', `${member.name} is ${described.state}`);
  check(sameSet(described.assignment, member.assignment), `${member.name}'s described assignment`);
  check(described.partitions_pending_revocation.length === 0, `${member.name} revokes nothing`);
}
const assignments = [a, b].map((m) => partitionsOf(m.assignment));

const staleEpoch = a.epoch;
await leave(a);
await leave(b);
const stale = await consumerGroupHeartbeat({
  client: coordinator,
  path: { group_id: group },
  body: { member_id: a.id, member_epoch: staleEpoch, owned_partitions: [] },
});
check(stale.response?.status === 404, `a heartbeat after leaving answers 404, got ${stale.response?.status}`);
const envelope: ErrorEnvelope | undefined = stale.error;
check(envelope !== undefined && envelope.error.code === 'UNKNOWN_MEMBER_ID', 'UNKNOWN_MEMBER_ID');
check(envelope.error.retriable === false, 'UNKNOWN_MEMBER_ID is not retriable');
const emptied = await describe();
check(emptied.state === 'empty' && emptied.members.length === 0, `group ${emptied.state} after both left`);

console.log(
  JSON.stringify({
    ok: true,
    topic,
    group,
    assignments,
    committed: Object.fromEntries(finalCommit),
    described: { state: description.state, members: description.members.length },
    unknown_member: envelope.error.code,
  }),
);
