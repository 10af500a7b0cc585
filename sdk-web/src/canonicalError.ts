import { SpecError } from "./errors.js";

/** A value with no canonical JSON form (NaN, an infinity, an inexact integer, a lone surrogate). */
export class CanonicalizationError extends SpecError {}
