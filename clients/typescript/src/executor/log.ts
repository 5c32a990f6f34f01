/** Attributes of a log line. */
export type LogAttrs = Record<string, unknown>;

/** Logger receives the executor's logs; never secrets (arguments and outputs are not logged). */
export interface Logger {
  debug(msg: string, attrs?: LogAttrs): void;
  info(msg: string, attrs?: LogAttrs): void;
  warn(msg: string, attrs?: LogAttrs): void;
  error(msg: string, attrs?: LogAttrs): void;
}

const levels = { debug: 0, info: 1, warn: 2, error: 3 } as const;

/** A log level name. */
export type LogLevel = keyof typeof levels;

/**
 * jsonLogger writes one JSON object per line ({"time","level","msg",…})
 * to stderr, from level on (default info), like the Go services'
 * --log-format=json.
 */
export function jsonLogger(level: LogLevel = "info", base: LogAttrs = {}): Logger {
  const min = levels[level];
  const write = (lvl: LogLevel, msg: string, attrs?: LogAttrs) => {
    if (levels[lvl] < min) return;
    const line: LogAttrs = { time: new Date().toISOString(), level: lvl.toUpperCase(), msg, ...base };
    for (const [k, v] of Object.entries(attrs ?? {})) {
      line[k] = v instanceof Error ? v.message : typeof v === "bigint" ? v.toString() : v;
    }
    process.stderr.write(JSON.stringify(line) + "\n");
  };
  return {
    debug: (m, a) => write("debug", m, a),
    info: (m, a) => write("info", m, a),
    warn: (m, a) => write("warn", m, a),
    error: (m, a) => write("error", m, a),
  };
}
