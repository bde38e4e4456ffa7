/**
 * @jobrelay/bullmq: BullMQ's `Queue.add` and `addBulk` on your Postgres transaction, through
 * jobrelay's outbox table; the relay (`--layout bullmq`) pushes the rows to Redis, where
 * BullMQ's own `Worker` runs them. docs/producers/node.md.
 */

/** `removeOnComplete` / `removeOnFail` as BullMQ's `KeepJobs`. */
export interface KeepJobs {
  /** Seconds a job is kept. */
  age?: number;
  /** How many jobs are kept. */
  count?: number;
}

/** BullMQ's `BackoffOptions`. */
export interface BackoffOptions {
  /** `fixed`, `exponential`, or the name of the worker's custom strategy. */
  type: 'fixed' | 'exponential' | (string & {});
  /** Milliseconds. */
  delay?: number;
  /** 0 to 1. */
  jitter?: number;
}

/**
 * The job options of BullMQ's `Queue.add` that go through the outbox: `jobId` (a uuid: the
 * row's), `delay` (the row's `run_at`), `sizeLimit` (checked at the call), `orderingKey` (the
 * row's `ordering_key`), and those the relay carries into the job's `opts`.
 */
export interface OutboxJobOptions {
  /** The job id: a lower-case uuid (the row's uuid); default a random one. */
  jobId?: string;
  /** Milliseconds before the job may run (the row's `run_at`). */
  delay?: number;
  /** Largest serialized data in bytes; a larger job is refused at the call. */
  sizeLimit?: number;
  /**
   * The job's ordering key (the row's `ordering_key`, not in the job's `opts`): the relay
   * keeps the order of the jobs of one key (docs/guarantees.md#per-key-order). 1 to 256
   * characters, no NUL.
   */
  orderingKey?: string;
  /** Runs of a failing job; default 0 (once). */
  attempts?: number;
  /** Wait before a retry: milliseconds (fixed) or BackoffOptions. */
  backoff?: number | BackoffOptions;
  removeOnComplete?: boolean | number | KeepJobs;
  removeOnFail?: boolean | number | KeepJobs;
  /** The job goes to the head of the wait list. */
  lifo?: boolean;
  /** Log lines kept. */
  keepLogs?: number;
  /** Stack traces kept. */
  stackTraceLimit?: number;
  /** 0 (none, first) to 2097151 (PRIORITY_LIMIT). */
  priority?: number;
}

/** A client that runs a parameterised statement on the caller's transaction. */
export interface Queryable {
  query(text: string, values: unknown[]): Promise<unknown>;
}

/** A Knex instance or transaction (Postgres), described by what the package uses. */
export interface KnexLike {
  (...args: never[]): unknown;
  raw(sql: string, bindings: readonly unknown[]): PromiseLike<unknown>;
  client: object;
}

/** The transaction's client: node-postgres (`PoolClient`, `Client`), Knex, or a Queryable. */
export type TransactionClient = Queryable | KnexLike;

export interface OutboxQueueOptions {
  /** BullMQ's key prefix, default `bull`; the relay's `--namespace` is it followed by `:`. */
  prefix?: string;
  /** Merged under each job's options, as BullMQ's `defaultJobOptions`. */
  defaultJobOptions?: OutboxJobOptions;
  /** The outbox table (the relay's `--table`), default `pending_jobs`. */
  table?: string;
  /** Ignored: the relay holds the Redis connection (taken so BullMQ's Queue options fit). */
  connection?: unknown;
}

/** What `add` returns: the job as its worker will see it. */
export interface OutboxJob<DataType = any, NameType extends string = string> {
  /** The job id, `job.id` in the worker: the row's uuid. */
  readonly id: string;
  readonly name: NameType;
  readonly data: DataType;
  /** The merged options, `jobId` included. */
  readonly opts: OutboxJobOptions & { jobId: string };
  readonly queueName: string;
}

export interface BulkJob<DataType = any, NameType extends string = string> {
  name: NameType;
  data: DataType;
  opts?: OutboxJobOptions;
}

export class OutboxQueue<DataType = any, NameType extends string = string> {
  constructor(name: string, opts?: OutboxQueueOptions);
  readonly name: string;
  readonly prefix: string;
  readonly table: string;
  /** The relay's `--namespace`: `${prefix}:`. */
  readonly namespace: string;
  readonly defaultJobOptions: OutboxJobOptions;
  /** Writes the job's row on the transaction of `db`; refusals throw before any statement. */
  add(
    name: NameType,
    data: DataType,
    opts: OutboxJobOptions | null | undefined,
    db: TransactionClient,
  ): Promise<OutboxJob<DataType, NameType>>;
  /** Writes every job's row with one statement, in order; one refusal writes none. */
  addBulk(
    jobs: readonly BulkJob<DataType, NameType>[],
    db: TransactionClient,
  ): Promise<OutboxJob<DataType, NameType>[]>;
}

/** A job option refused at the call (BullMQ's message where BullMQ refuses it too). */
export class OutboxError extends Error {}

/** The version 5 uuid of a key of yours: the same key, the same job id. */
export function jobIdFromKey(key: string): string;

/** The options the relay carries into the job's `opts`. */
export const CARRIED_OPTIONS: readonly string[];

/** BullMQ's highest priority, 2 ** 21 - 1. */
export const PRIORITY_LIMIT: number;
