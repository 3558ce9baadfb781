/** Where this client's log lines go: the application's DBOS logger unless `connect()` is given another. */

import { DBOS } from '@dbos-inc/dbos-sdk';

export interface Logger {
  debug(message: string): void;
  info(message: string): void;
  warn(message: string): void;
  error(message: string): void;
}

/** DBOS's logger, looked up at each line: it is the launched executor's while there is one. */
export const dbosLogger: Logger = {
  debug: (message) => DBOS.logger.debug(message),
  info: (message) => DBOS.logger.info(message),
  warn: (message) => DBOS.logger.warn(message),
  error: (message) => DBOS.logger.error(message),
};

/** `logger`, except that a line it fails to write is dropped: the client logs from socket events and timers, where
 * an exception would reach the application as an uncaught one. */
export function safeLogger(logger: Logger): Logger {
  const guarded = (level: keyof Logger) => (message: string) => {
    try {
      logger[level](message);
    } catch {
      // nowhere better to say it
    }
  };
  return { debug: guarded('debug'), info: guarded('info'), warn: guarded('warn'), error: guarded('error') };
}

/** A number as C's and Python's `%g` writes it (six significant digits, no trailing zeros): 2 → "2", 0.5 → "0.5",
 * 15 → "15", 1234567 → "1.23457e+06". */
export function formatG(value: number): string {
  if (!Number.isFinite(value)) return String(value);
  if (value === 0) return '0';
  const exponent = Math.floor(Math.log10(Math.abs(Number(value.toPrecision(6)))));
  if (exponent < -4 || exponent >= 6) {
    const [mantissa, power] = value.toExponential(5).split('e') as [string, string];
    const trimmed = mantissa.includes('.') ? mantissa.replace(/\.?0+$/, '') : mantissa;
    const sign = power.startsWith('-') ? '-' : '+';
    return `${trimmed}e${sign}${power.replace(/^[-+]/, '').padStart(2, '0')}`;
  }
  const fixed = value.toFixed(Math.max(0, 5 - exponent));
  return fixed.includes('.') ? fixed.replace(/\.?0+$/, '') : fixed;
}
