/** @ldp-telemetry/web: the public surface. */
export * from "./errors.js";
export { canonicalJson, memoDerivationJson, pythonFloatRepr } from "./canonical.js";
export { xxh32Bytes, xxh32U32, reduceRange, hashToRange, utf8 } from "./hashing.js";
export { CryptoSource, SimulationSource, ReplaySource, ReplayMismatchError, type RandomSource } from "./random.js";
export { bernoulliWords, probabilityDigits } from "./bernoulli.js";
export { ReportSpec, MechanismSpec, pureProtocolVariance, hex, fromHex, type RecordField } from "./mechanisms/base.js";
export {
  MECHANISMS,
  FREQUENCY_MECHANISMS,
  makeSpec,
  makeFrequencySpec,
  specFromDict,
  BinaryRRSpec,
  GRRSpec,
  OUESpec,
  RapporSpec,
  OLHSpec,
  CMSSpec,
  HCMSSpec,
  HRSpec,
  DuchiSpec,
  PiecewiseSpec,
  HybridSpec,
  SquareWaveSpec,
  OneBitMeanSpec,
  DBitFlipSpec,
  LolohaSpec,
  PEMSpec,
  SFPSpec,
} from "./mechanisms/index.js";
export { NumericSpec, MeanSpec, SCALE, EPSILON_STAR, hybridAlpha, bestMeanMechanism, duchiVariance, pmVariance, hmVariance } from "./mechanisms/numeric.js";
export { squareWaveB } from "./mechanisms/squarewave.js";
export { optimalG, irrEpsilon } from "./mechanisms/loloha.js";
export { padValue, prefixKey, KEY_DOMAIN } from "./mechanisms/heavyhitters.js";
export { encodeReport, type EncodeContext } from "./record.js";
export { Dictionary, HashedDomain, canonicalBytes, domainFromDict, type Domain, type Value } from "./domain.js";
export { NumberRange, StringDomain, type DomainInput } from "./valuedomains.js";
export {
  FRAME_CONTENT_TYPE,
  crc32,
  makeBatch,
  encodeFrame,
  decodeFrame,
  encodeJson,
  decodeJson,
  readHeader,
  batchToJsonObj,
  type ReportBatch,
  type FrameHeader,
  type SpecResolver,
} from "./wire.js";
export { parseMetrics, fetchMetrics, utcDay, type MetricDefinition, type MetricSet } from "./metrics.js";
export { LocalPolicy, toUnits, EPSILON_UNIT, type LocalPolicyOptions } from "./policy.js";
export {
  TelemetryClient,
  LocalLocks,
  parseRetryAfter,
  ERROR_TALLIES,
  STAT_TALLIES,
  TOKENS_REQUIRED_MESSAGE,
  type ClientOptions,
  type DayBudget,
  type MetricBudget,
  type LockManagerLike,
  type UploadResult,
  type UploadRejection,
  type UploadWait,
  type FlushResult,
  type TokenOptions,
} from "./client.js";
export {
  DeviceIdentity,
  IssuerClient,
  TokenError,
  challengeDigest,
  tokenInput,
  authorizationHeader,
  rsaEncryptionSpki,
  isoDay,
  CREDENTIAL_HEADER,
  SIGNATURE_HEADER,
  type TokenKeyDocument,
  type TokenKeyEntry,
  type KeyPin,
  type KeyPinStore,
} from "./tokens.js";
export { TokenWallet } from "./wallet.js";
export {
  AnalyzerPublicKey,
  SealingError,
  SEALED_OVERHEAD,
  keyIdOf,
  sealedInfo,
  sealRecords,
  openRecord,
  encodeSealedFrame,
  parseAnalyzerKeys,
} from "./sealing.js";
