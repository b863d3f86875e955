// A small TAP harness for the gjs tests.
//
// SPDX-License-Identifier: LGPL-2.1-or-later
//
// Tests may be async. They run inside a GLib main loop started at module
// level: awaiting a promise before that loop runs would leave the loop
// nested inside gjs's job queue, where promise callbacks never run.

import Gio from 'gi://Gio';
import GLib from 'gi://GLib';
import System from 'system';

let currentTest = null;
let recordsStarted = false;

// Typed arrays print through Array.from(): their own toString() warns in
// gjs 1.74, which is fatal under G_DEBUG=fatal-warnings.
export function show(value) {
    if (ArrayBuffer.isView(value) || Array.isArray(value))
        return `[${Array.from(value, show).join(', ')}]`;
    return String(value);
}

export function assertEqual(actual, expected, what = 'value') {
    if (show(actual) !== show(expected))
        throw new Error(`${what}: got ${show(actual)}, expected ${show(expected)}`);
}

export function assertTrue(condition, what) {
    if (!condition)
        throw new Error(`${what}: not true`);
}

// Runs func, which must throw a GLib.Error of (domain, code) whose message
// contains fragment.
export function assertThrowsGError(domain, code, fragment, func) {
    try {
        func();
    } catch (e) {
        if (!(e instanceof GLib.Error))
            throw e;
        if (!e.matches(domain, code))
            throw new Error(`wrong error (domain ${e.domain}, code ${e.code}): ${e.message}`);
        if (!e.message.includes(fragment))
            throw new Error(`"${e.message}" does not mention "${fragment}"`);
        return e;
    }
    throw new Error(`no error; expected one mentioning "${fragment}"`);
}

// "CP_TENSOR_ERROR_SHAPE" for the library's registered error enums,
// "domain-quark 3" for any other domain.
function errorCodeName(error) {
    const domain = GLib.quark_to_string(error.domain);
    const match = /^cp-(\w+)-error-quark$/.exec(domain);
    const Cp = imports.gi.Cp;
    if (match) {
        const enumName = `${match[1][0].toUpperCase()}${match[1].slice(1)}Error`;
        const entry = Object.entries(Cp[enumName] ?? {}).find(([, v]) => v === error.code);
        if (entry)
            return `CP_${match[1].toUpperCase()}_ERROR_${entry[0]}`;
    }
    return `${domain} ${error.code}`;
}

// Appends a JSON line for doc/reliability.md to $CP_RELIABILITY_LOG, like
// tests/python/reliability.py; the first record of the process empties it
// unless CP_RELIABILITY_APPEND is set (a process recording for its parent).
function appendRecord(subject, what, outcome, message) {
    const path = GLib.getenv('CP_RELIABILITY_LOG');
    if (!path)
        return;
    const script = GLib.path_get_basename(System.programPath ?? System.programInvocationName);
    const line = `${JSON.stringify({
        subject, case: what, error: outcome, message, test: `${script}: ${currentTest}`,
    })}\n`;
    const file = Gio.File.new_for_path(path);
    GLib.mkdir_with_parents(GLib.path_get_dirname(path), 0o755);
    const stream = recordsStarted || GLib.getenv('CP_RELIABILITY_APPEND')
        ? file.append_to(Gio.FileCreateFlags.NONE, null)
        : file.replace(null, false, Gio.FileCreateFlags.NONE, null);
    recordsStarted = true;
    stream.write_bytes(new GLib.Bytes(new TextEncoder().encode(line)), null);
    stream.close(null);
}

// Records a GLib.Error caught by the test itself (a rejected promise).
export function recordError(subject, what, error) {
    assertTrue(error.message.length > 0, 'the error has a message');
    appendRecord(subject, what, errorCodeName(error), error.message);
}

// Records a failure that is not a GError (a message on stderr, an exit
// status), as tests/python/reliability.py's record_outcome does: outcome
// reads like "message on stderr".
export function recordOutcome(subject, what, outcome, message) {
    assertTrue(message.length > 0, 'the failure has a message');
    appendRecord(subject, what, outcome, message);
}

// assertThrowsGError, and records the case (what was tried against
// subject) for doc/reliability.md.
export function assertCase(subject, what, domain, code, fragment, func) {
    const error = assertThrowsGError(domain, code, fragment, func);
    assertTrue(error.message.length > 0, 'the error has a message');
    recordError(subject, what, error);
    return error;
}

// A test still running after this long has hung: it fails then, rather
// than when Meson kills the program.
const TEST_LIMIT_MS = 10000;

// Settles like promise, or rejects once TEST_LIMIT_MS have passed.
function withinLimit(promise) {
    let timer = 0;
    const limit = new Promise((resolve, reject) => {
        timer = GLib.timeout_add(GLib.PRIORITY_DEFAULT, TEST_LIMIT_MS, () => {
            timer = 0;
            reject(new Error(`still running ${TEST_LIMIT_MS} ms after it started: ` +
                'a wait that should have ended did not'));
            return GLib.SOURCE_REMOVE;
        });
    });
    return Promise.race([promise, limit]).finally(() => {
        if (timer)
            GLib.source_remove(timer);
    });
}

// Runs [name, func] pairs in order, prints TAP and exits non-zero when a
// test failed.
export function run(tests) {
    const loop = GLib.MainLoop.new(null, false);
    let failed = 0;

    print(`1..${tests.length}`);
    (async () => {
        for (const [index, [name, func]] of tests.entries()) {
            currentTest = name;
            try {
                // eslint-disable-next-line no-await-in-loop
                await withinLimit((async () => func())());
                print(`ok ${index + 1} - ${name}`);
            } catch (e) {
                failed++;
                print(`not ok ${index + 1} - ${name}`);
                printerr(`# ${name}: ${e.message}\n${e.stack}`);
            }
        }
    })().finally(() => loop.quit());
    loop.run();
    System.exit(failed > 0 ? 1 : 0);
}
