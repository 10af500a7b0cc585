/** The SDK's errors: one small tree, mirroring ldp_core/errors.py. */

/** Base of every error the SDK raises. */
export class LDPError extends Error {
  constructor(message: string) {
    super(message);
    this.name = new.target.name;
  }
}

/** A mechanism specification is invalid (the message says how to fix it). */
export class SpecError extends LDPError {}

/** A value is outside a metric's domain. */
export class DomainError extends LDPError {}

/** A wire frame is malformed; the message names the part at fault. */
export class FrameError extends LDPError {}

/** A frame was made under another spec than the reader's. */
export class SpecMismatchError extends FrameError {}

/** A privacy-budget configuration or charge is invalid. */
export class BudgetError extends LDPError {}

/** A metrics file (or one metric in it) is invalid. */
export class MetricsFileError extends SpecError {}

/** The client was configured wrongly: raised at construction, never from record(). */
export class ClientConfigError extends LDPError {}
