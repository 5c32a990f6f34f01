import type { JsonObject } from "@bufbuild/protobuf";
import { Ajv2020, type ErrorObject, type ValidateFunction } from "ajv/dist/2020.js";

/** A schema check's failure: the offending field ("args.to[1]") and why. */
export interface ArgsProblem {
  field: string;
  message: string;
}

// Formats are annotations in 2020-12 (as in the supervisor's validator);
// unknown keywords of a tool's schema are not errors.
const ajv = new Ajv2020({ strict: false, allErrors: false, validateFormats: false });

/** compileArgsSchema compiles a tool's argument schema; it throws naming the tool when the schema is invalid. */
export function compileArgsSchema(tool: string, schema: JsonObject | undefined): ValidateFunction | undefined {
  if (schema === undefined || Object.keys(schema).length === 0) return undefined;
  try {
    return ajv.compile(schema);
  } catch (err) {
    throw new Error(`tool ${tool}: argsSchema: ${(err as Error).message}`, { cause: err });
  }
}

/** checkArgs validates args and returns the first problem, or undefined. */
export function checkArgs(validate: ValidateFunction | undefined, args: JsonObject): ArgsProblem | undefined {
  if (validate === undefined || validate(args)) return undefined;
  const e = validate.errors?.[0];
  if (e === undefined) return { field: "args", message: "args: invalid" };
  const field = fieldOf(e);
  return { field, message: `${field}: ${e.message ?? "invalid"}` };
}

// fieldOf names the field of an error the way the Go executors do:
// "args.to[1]", "args.name" for a missing property.
function fieldOf(e: ErrorObject): string {
  let field = "args";
  for (const tok of e.instancePath.split("/").slice(1)) {
    const t = tok.replace(/~1/g, "/").replace(/~0/g, "~");
    field += /^\d+$/.test(t) ? `[${t}]` : `.${t}`;
  }
  const p = e.params as { missingProperty?: string; additionalProperty?: string };
  if (e.keyword === "required" && p.missingProperty) field += `.${p.missingProperty}`;
  if (e.keyword === "additionalProperties" && p.additionalProperty) field += `.${p.additionalProperty}`;
  return field;
}
