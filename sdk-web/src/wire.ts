/**
 * Wire format v1, byte for byte as ldp_core/wire/frames.py: one batch = one metric, one spec, one day.
 *
 *     0  4  magic "LDPB"          20 4  record size R
 *     4  1  version (1)           24 4  number of records n
 *     5  1  flags (0: plain)      28 16 batch id
 *     6  2  metric length L       44 L  metric name (UTF-8)
 *     8  8  spec id (8 bytes)     ..  n·R records
 *     16 4  day (since 1970)      ..  4  CRC-32 of every byte before it
 *
 * All integers little-endian. The JSON form: `{"version":1,"metric","spec_id","day","batch_id",
 * "records":[[field, ...], ...]}`, integer fields as numbers and packed bits as hex strings, in
 * that key order with no whitespace (what Python's `json.dumps(..., separators=(",", ":"))` writes).
 */
import { FrameError, SpecMismatchError } from "./errors.js";
import { utf8 } from "./hashing.js";
import { ReportSpec, fromHex, getUint, hex, putUint, type RecordField } from "./mechanisms/base.js";

export const FRAME_CONTENT_TYPE = "application/vnd.ldp.frame";
export const MAGIC = utf8("LDPB");
export const VERSION = 1;
export const FLAG_SEALED = 0x01;
export const HEADER_SIZE = 44;
export const MAX_RECORDS = 1 << 24;
const METRIC_RE = /^[A-Za-z0-9_.:-]{1,255}$/;

const CRC_TABLE = (() => {
  const t = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    t[n] = c >>> 0;
  }
  return t;
})();

/** CRC-32 (the zlib / IEEE 802.3 polynomial), as Python's `zlib.crc32`. */
export function crc32(data: Uint8Array): number {
  let c = 0xffffffff;
  for (let i = 0; i < data.length; i++) c = (CRC_TABLE[(c ^ (data[i] as number)) & 0xff] as number) ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

export function checkMetric(metric: unknown): string {
  if (typeof metric !== "string" || !METRIC_RE.test(metric)) {
    throw new FrameError(`metric name ${JSON.stringify(metric)} is invalid: use 1-255 characters from letters, digits and _ . : -`);
  }
  return metric;
}

/** Privatized reports of one metric, under one spec, for one UTC day. */
export interface ReportBatch {
  readonly metric: string;
  readonly spec: ReportSpec;
  readonly day: number;
  /** The records, concatenated (n · spec.recordSize bytes). */
  readonly records: Uint8Array;
  readonly batchId: Uint8Array;
}

export function makeBatch(metric: string, spec: ReportSpec, day: number, records: readonly Uint8Array[] | Uint8Array, batchId: Uint8Array): ReportBatch {
  checkMetric(metric);
  if (!Number.isInteger(day) || day < 0 || day >= 2 ** 32) throw new FrameError(`day must be an integer number of days since 1970-01-01, got ${day}`);
  if (!(batchId instanceof Uint8Array) || batchId.length !== 16) throw new FrameError("batch_id must be 16 bytes");
  let flat: Uint8Array;
  if (records instanceof Uint8Array) flat = records;
  else {
    flat = new Uint8Array(records.length * spec.recordSize);
    records.forEach((r, i) => {
      if (r.length !== spec.recordSize) throw new SpecMismatchError(`record ${i} has ${r.length} bytes; spec ${spec.name} (${spec.specId}) records have ${spec.recordSize}`);
      flat.set(r, i * spec.recordSize);
    });
  }
  if (flat.length % spec.recordSize) throw new SpecMismatchError(`${flat.length} record bytes are not a whole number of ${spec.recordSize}-byte records`);
  if (flat.length / spec.recordSize > MAX_RECORDS) throw new FrameError(`a batch holds at most ${MAX_RECORDS} records`);
  return { metric, spec, day, records: flat, batchId: Uint8Array.from(batchId) };
}

export function batchLength(batch: ReportBatch): number {
  return batch.records.length / batch.spec.recordSize;
}

/** Serialize `batch` as a v1 binary frame. */
export function encodeFrame(batch: ReportBatch): Uint8Array {
  const metric = utf8(batch.metric);
  const n = batchLength(batch);
  const size = HEADER_SIZE + metric.length + batch.records.length + 4;
  const out = new Uint8Array(size);
  const dv = new DataView(out.buffer);
  out.set(MAGIC, 0);
  out[4] = VERSION;
  out[5] = 0;
  dv.setUint16(6, metric.length, true);
  out.set(fromHex(batch.spec.specId), 8);
  dv.setUint32(16, batch.day, true);
  dv.setUint32(20, batch.spec.recordSize, true);
  dv.setUint32(24, n, true);
  out.set(batch.batchId, 28);
  out.set(metric, HEADER_SIZE);
  out.set(batch.records, HEADER_SIZE + metric.length);
  dv.setUint32(size - 4, crc32(out.subarray(0, size - 4)), true);
  return out;
}

export interface FrameHeader {
  readonly version: number;
  readonly metric: string;
  readonly specId: string;
  readonly day: number;
  readonly recordSize: number;
  readonly nRecords: number;
  readonly batchId: Uint8Array;
  readonly sealed: boolean;
}

/** Parse and check a frame's header and length. */
export function readHeader(data: Uint8Array): FrameHeader {
  if (data.length < HEADER_SIZE) throw new FrameError(`frame is truncated: ${data.length} bytes, the header alone is ${HEADER_SIZE}`);
  const dv = new DataView(data.buffer, data.byteOffset, data.byteLength);
  for (let i = 0; i < 4; i++) if (data[i] !== MAGIC[i]) throw new FrameError("bad magic: not an LDP report frame (expected LDPB)");
  const version = data[4] as number;
  if (version !== VERSION) throw new FrameError(`unsupported frame version ${version}; this reader understands version ${VERSION}`);
  const flags = data[5] as number;
  if (flags & ~FLAG_SEALED) throw new FrameError(`unknown flags 0x${flags.toString(16).padStart(2, "0")}; version 1 frames have flags 0 (plain) or 1 (sealed records)`);
  const mlen = dv.getUint16(6, true);
  if (mlen < 1 || mlen > 255) throw new FrameError(`metric name length ${mlen} must be between 1 and 255`);
  const rsize = dv.getUint32(20, true);
  if (rsize === 0) throw new FrameError("record size 0 is invalid");
  const n = dv.getUint32(24, true);
  if (n > MAX_RECORDS) throw new FrameError(`frame declares ${n} records; at most ${MAX_RECORDS} are allowed`);
  const expected = HEADER_SIZE + mlen + rsize * n + 4;
  if (data.length < expected) throw new FrameError(`frame is truncated: ${data.length} bytes, its header declares ${expected}`);
  if (data.length > expected) throw new FrameError(`frame has ${data.length - expected} trailing bytes after the declared ${expected}`);
  let metric: string;
  try {
    metric = new TextDecoder("utf-8", { fatal: true }).decode(data.subarray(HEADER_SIZE, HEADER_SIZE + mlen));
  } catch {
    throw new FrameError("metric name is not valid UTF-8");
  }
  checkMetric(metric);
  return { version, metric, specId: hex(data.subarray(8, 16)), day: dv.getUint32(16, true), recordSize: rsize, nRecords: n, batchId: data.slice(28, 44), sealed: Boolean(flags & FLAG_SEALED) };
}

/** One spec, a map spec id -> spec, or a function (metric, specId) -> spec. */
export type SpecResolver = ReportSpec | ReadonlyMap<string, ReportSpec> | ((metric: string, specId: string) => ReportSpec);

function resolve(specs: SpecResolver, metric: string, specId: string): ReportSpec {
  let spec: ReportSpec | undefined;
  if (specs instanceof ReportSpec) spec = specs;
  else if (typeof specs === "function") spec = specs(metric, specId);
  else {
    spec = specs.get(specId);
    if (!spec) throw new SpecMismatchError(`metric ${JSON.stringify(metric)}: unknown spec_id ${specId}`);
  }
  if (specId !== spec.specId) throw new SpecMismatchError(`metric ${JSON.stringify(metric)}: frame was made under spec ${specId}, expected ${spec.specId} (${spec.name})`);
  return spec;
}

/** Raise FrameError if a record cannot have come from `spec` (integer bounds, padding bits). */
export function checkRecord(spec: ReportSpec, rec: Uint8Array, index: number): void {
  let off = 0;
  for (const f of spec.recordFields) {
    if (f.kind === "uint" && f.bound !== undefined) {
      const v = getUint(rec, off, f.size);
      if (v >= f.bound) throw new FrameError(`${spec.name}: record ${index} has ${f.name}=${v}, which must be below ${f.bound}`);
    }
    if (f.kind === "uint" && f.signed && f.min !== undefined) {
      const u = getUint(rec, off, f.size);
      const v = u >= 2 ** (8 * f.size - 1) ? u - 2 ** (8 * f.size) : u;
      if (v < f.min) throw new FrameError(`${spec.name}: record ${index} has ${f.name}=${v}, which must be at least ${f.min}`);
    }
    if (f.kind === "bytes" && f.nbits !== undefined && f.nbits % 8) {
      if ((rec[off + f.size - 1] as number) >> (f.nbits % 8)) throw new FrameError(`${spec.name}: record ${index} sets padding bits above bit ${f.nbits - 1} in its last byte; they must be 0`);
    }
    off += f.size;
  }
}

/** Parse a binary frame (plain frames only: this SDK does not seal). */
export function decodeFrame(data: Uint8Array, specs: SpecResolver): ReportBatch {
  const h = readHeader(data);
  const bodyEnd = data.length - 4;
  const crc = new DataView(data.buffer, data.byteOffset, data.byteLength).getUint32(bodyEnd, true);
  if (crc32(data.subarray(0, bodyEnd)) !== crc) throw new FrameError("CRC-32 mismatch: the frame was corrupted in transit");
  if (h.sealed) throw new FrameError("sealed frames are not supported by the web SDK");
  const spec = resolve(specs, h.metric, h.specId);
  if (h.recordSize !== spec.recordSize) throw new SpecMismatchError(`record size ${h.recordSize} does not match spec ${spec.name}'s ${spec.recordSize}`);
  const off = HEADER_SIZE + utf8(h.metric).length;
  const records = data.slice(off, off + h.recordSize * h.nRecords);
  for (let i = 0; i < h.nRecords; i++) checkRecord(spec, records.subarray(i * h.recordSize, (i + 1) * h.recordSize), i);
  return makeBatch(h.metric, spec, h.day, records, h.batchId);
}

/** A record's fields as the JSON form writes them. */
export function recordToJson(fields: readonly RecordField[], rec: Uint8Array): (number | string)[] {
  const out: (number | string)[] = [];
  let off = 0;
  for (const f of fields) {
    const v = f.kind === "bytes" ? hex(rec.subarray(off, off + f.size)) : getUint(rec, off, f.size);
    out.push(f.signed && typeof v === "number" && v >= 2 ** (8 * f.size - 1) ? v - 2 ** (8 * f.size) : v);
    off += f.size;
  }
  return out;
}

export interface JsonFrame {
  version: number;
  metric: string;
  spec_id: string;
  day: number;
  batch_id: string;
  records: (number | string)[][];
}

export function batchToJsonObj(batch: ReportBatch): JsonFrame {
  const size = batch.spec.recordSize;
  const records: (number | string)[][] = [];
  for (let i = 0; i < batchLength(batch); i++) records.push(recordToJson(batch.spec.recordFields, batch.records.subarray(i * size, (i + 1) * size)));
  return { version: VERSION, metric: batch.metric, spec_id: batch.spec.specId, day: batch.day, batch_id: hex(batch.batchId), records };
}

/** Serialize `batch` in the JSON form (the same text Python's `encode_json` writes). */
export function encodeJson(batch: ReportBatch): string {
  return JSON.stringify(batchToJsonObj(batch));
}

/** Parse the JSON form (text or an already parsed object). */
export function decodeJson(data: string | JsonFrame, specs: SpecResolver): ReportBatch {
  let obj: unknown;
  if (typeof data === "string") {
    try {
      obj = JSON.parse(data);
    } catch (e) {
      throw new FrameError(`JSON frame does not parse: ${(e as Error).message}`);
    }
  } else obj = data;
  if (obj === null || typeof obj !== "object" || Array.isArray(obj)) throw new FrameError("JSON frame must be an object");
  const o = obj as Record<string, unknown>;
  const missing = ["version", "metric", "spec_id", "day", "batch_id", "records"].filter((k) => !(k in o));
  if (missing.length) throw new FrameError(`JSON frame lacks ${JSON.stringify(missing.sort())}`);
  if (o.version !== VERSION) throw new FrameError(`unsupported frame version ${JSON.stringify(o.version)}; expected ${VERSION}`);
  const metric = checkMetric(o.metric);
  const specId = o.spec_id;
  if (typeof specId !== "string" || !/^[0-9a-f]{16}$/.test(specId)) throw new FrameError(`spec_id must be 16 lowercase hex digits, got ${JSON.stringify(specId)}`);
  let batchId: Uint8Array;
  try {
    batchId = fromHex(o.batch_id as string);
  } catch {
    throw new FrameError(`batch_id must be 32 hex digits, got ${JSON.stringify(o.batch_id)}`);
  }
  const spec = resolve(specs, metric, specId);
  const rows = o.records;
  if (!Array.isArray(rows)) throw new FrameError("records must be a list");
  if (rows.length > MAX_RECORDS) throw new FrameError(`a batch holds at most ${MAX_RECORDS} records, got ${rows.length}`);
  const fields = spec.recordFields;
  const size = spec.recordSize;
  const records = new Uint8Array(rows.length * size);
  rows.forEach((row: unknown, i) => {
    if (!Array.isArray(row) || row.length !== fields.length) throw new FrameError(`record ${i} must be a list of ${fields.length} fields [${fields.map((f) => f.name).join(", ")}]`);
    let off = i * size;
    fields.forEach((f, j) => {
      const val: unknown = row[j];
      if (f.kind === "bytes") {
        let raw: Uint8Array;
        try {
          raw = fromHex(val as string);
        } catch {
          throw new FrameError(`record ${i} field ${f.name} must be a hex string`);
        }
        if (raw.length !== f.size) throw new FrameError(`record ${i} field ${f.name} has ${raw.length} bytes, expected ${f.size}`);
        records.set(raw, off);
      } else {
        if (typeof val !== "number" || !Number.isInteger(val)) throw new FrameError(`record ${i} field ${f.name} must be an integer, got ${JSON.stringify(val)}`);
        const [lo, hi] = f.signed ? [-(2 ** (8 * f.size - 1)), 2 ** (8 * f.size - 1)] : [0, 2 ** (8 * f.size)];
        if (val < lo || val >= hi) throw new FrameError(`record ${i} field ${f.name}=${val} does not fit ${f.size} byte(s)`);
        putUint(records, off, f.size, val < 0 ? val + 2 ** (8 * f.size) : val);
      }
      off += f.size;
    });
    checkRecord(spec, records.subarray(i * size, (i + 1) * size), i);
  });
  return makeBatch(metric, spec, o.day as number, records, batchId);
}
