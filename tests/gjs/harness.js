// A small TAP harness for the gjs tests.
//
// SPDX-License-Identifier: LGPL-2.1-or-later
//
// Tests may be async. They run inside a GLib main loop started at module
// level: awaiting a promise before that loop runs would leave the loop
// nested inside gjs's job queue, where promise callbacks never run.

import GLib from 'gi://GLib';
import System from 'system';

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

// Runs [name, func] pairs in order, prints TAP and exits non-zero when a
// test failed.
export function run(tests) {
    const loop = GLib.MainLoop.new(null, false);
    let failed = 0;

    print(`1..${tests.length}`);
    (async () => {
        for (const [index, [name, func]] of tests.entries()) {
            try {
                // eslint-disable-next-line no-await-in-loop
                await func();
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
