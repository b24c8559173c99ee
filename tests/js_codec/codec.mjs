// A small enginewire codec in JavaScript (Node 20, no packages), driven only by
// `enginewire spec export` (the JSON file named by argv[2]). It speaks the suite's codec line
// protocol on stdin/stdout (docs/conformance.md, "External programs"): encode and decode every
// message kind and struct whose values hold no tensors, with vLLM's typing; anything with a
// tensor, ndarray or out-of-band buffer it answers "unsupported". Its hello answer declares
// the role in JS_CODEC_ROLE (default "both").
//
//   node tests/js_codec/codec.mjs EXPORT.json
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";

// --- tagged JSON with exact numbers -----------------------------------------------------------
// Integers become BigInt, floats instances of F: the tagged JSON tells them apart by their text.
class F { constructor(v) { this.v = v; } }

function parseJson(text) {
  let i = 0;
  const ws = () => { while (i < text.length && " \t\r\n".includes(text[i])) i++; };
  function value() {
    ws();
    const c = text[i];
    if (c === "{") {
      i++; const out = {}; ws();
      if (text[i] === "}") { i++; return out; }
      for (;;) {
        ws(); const k = str(); ws(); i++; // ':'
        out[k] = value(); ws();
        if (text[i++] === "}") return out;
      }
    }
    if (c === "[") {
      i++; const out = []; ws();
      if (text[i] === "]") { i++; return out; }
      for (;;) { out.push(value()); ws(); if (text[i++] === "]") return out; }
    }
    if (c === '"') return str();
    if (text.startsWith("true", i)) { i += 4; return true; }
    if (text.startsWith("false", i)) { i += 5; return false; }
    if (text.startsWith("null", i)) { i += 4; return null; }
    const m = /^-?\d+(\.\d+)?([eE][+-]?\d+)?/.exec(text.slice(i, i + 400));
    i += m[0].length;
    return (m[1] || m[2]) ? new F(Number(m[0])) : BigInt(m[0]);
  }
  function str() {
    let j = i + 1, raw = "";
    while (text[j] !== '"') { if (text[j] === "\\") j++; j++; }
    raw = text.slice(i, j + 1); i = j + 1;
    return JSON.parse(raw);
  }
  return value();
}

function dumpJson(v) {
  if (v === null || v === undefined) return "null";
  if (typeof v === "bigint") return v.toString();
  if (v instanceof F) {
    if (!Number.isFinite(v.v)) return JSON.stringify({ $float: Number.isNaN(v.v) ? "nan" : v.v > 0 ? "inf" : "-inf" });
    const t = JSON.stringify(v.v);
    return /[.eE]/.test(t) ? t : t + ".0";
  }
  if (typeof v === "boolean") return v ? "true" : "false";
  if (typeof v === "string") return JSON.stringify(v);
  if (Array.isArray(v)) return "[" + v.map(dumpJson).join(",") + "]";
  return "{" + Object.entries(v).map(([k, x]) => JSON.stringify(k) + ":" + dumpJson(x)).join(",") + "}";
}

// --- msgpack ----------------------------------------------------------------------------------
class Ext { constructor(code, data) { this.code = code; this.data = data; } }
// An Invalid names the spec clause the input breaks where the codec knows it (the suite's
// SHOULD frames.rejection-names-clause); a type error in a payload breaks
// frames.payload-matches-type, the default.
class Invalid extends Error {
  constructor(message, clause = "frames.payload-matches-type") { super(message); this.clause = clause; }
}
class Unsupported extends Error {}

function pack(v, out) {
  const u8 = (...b) => out.push(...b);
  const be = (n, bytes) => { for (let k = bytes - 1; k >= 0; k--) out.push(Number((BigInt(n) >> BigInt(8 * k)) & 0xffn)); };
  if (v === null) return u8(0xc0);
  if (v === true) return u8(0xc3);
  if (v === false) return u8(0xc2);
  if (typeof v === "bigint") {
    if (v >= 0n) {
      if (v < 128n) return u8(Number(v));
      if (v < 256n) return u8(0xcc, Number(v));
      if (v < 65536n) { u8(0xcd); return be(v, 2); }
      if (v < 4294967296n) { u8(0xce); return be(v, 4); }
      if (v < 18446744073709551616n) { u8(0xcf); return be(v, 8); }
      throw new Invalid("integer out of range");
    }
    if (v >= -32n) return u8(0x100 + Number(v));
    const w = v >= -128n ? [0xd0, 1] : v >= -32768n ? [0xd1, 2] : v >= -2147483648n ? [0xd2, 4] : v >= -9223372036854775808n ? [0xd3, 8] : null;
    if (w === null) throw new Invalid("integer out of range");
    u8(w[0]); return be(BigInt.asUintN(8 * w[1], v), w[1]);
  }
  if (v instanceof F) { const b = Buffer.alloc(8); b.writeDoubleBE(v.v); return u8(0xcb, ...b); }
  if (typeof v === "string") {
    const b = Buffer.from(v, "utf8"), n = b.length;
    if (n < 32) u8(0xa0 | n); else if (n < 256) u8(0xd9, n); else if (n < 65536) { u8(0xda); be(n, 2); } else { u8(0xdb); be(n, 4); }
    return u8(...b);
  }
  if (v instanceof Uint8Array) {
    const n = v.length;
    if (n < 256) u8(0xc4, n); else if (n < 65536) { u8(0xc5); be(n, 2); } else { u8(0xc6); be(n, 4); }
    for (const x of v) out.push(x);
    return;
  }
  if (v instanceof Ext) {
    const n = v.data.length, fix = { 1: 0xd4, 2: 0xd5, 4: 0xd6, 8: 0xd7, 16: 0xd8 }[n];
    if (fix) u8(fix); else if (n < 256) u8(0xc7, n); else if (n < 65536) { u8(0xc8); be(n, 2); } else { u8(0xc9); be(n, 4); }
    u8(v.code); for (const x of v.data) out.push(x);
    return;
  }
  if (Array.isArray(v)) {
    const n = v.length;
    if (n < 16) u8(0x90 | n); else if (n < 65536) { u8(0xdc); be(n, 2); } else { u8(0xdd); be(n, 4); }
    for (const x of v) pack(x, out);
    return;
  }
  if (v instanceof WireMap) {
    // JS_CODEC_BREAK=map-header: size the header by the keys written (a byte-exactness bug
    // the tests show the suite catches).
    const n = v.entries.length, width = process.env.JS_CODEC_BREAK === "map-header" ? n : v.width ?? n;
    if (width < 16) u8(0x80 | n); else if (width < 65536) { u8(0xde); be(n, 2); } else { u8(0xdf); be(n, 4); }
    for (const [k, x] of v.entries) { pack(k, out); pack(x, out); }
    return;
  }
  throw new Invalid("cannot pack " + typeof v);
}

// A msgpack map: ordered entries; `width` sizes the header (a struct's field count).
class WireMap { constructor(entries, width) { this.entries = entries; this.width = width; } }

function unpack(buf) {
  let i = 0;
  const need = (n) => { if (i + n > buf.length) throw new Invalid("truncated msgpack"); };
  const uint = (n) => { need(n); let v = 0n; for (let k = 0; k < n; k++) v = (v << 8n) | BigInt(buf[i++]); return v; };
  const bytes = (n) => { need(n); const b = buf.subarray(i, i + n); i += n; return new Uint8Array(b); };
  const text = (n) => { const b = bytes(n); const s = new TextDecoder("utf-8", { fatal: true }).decode(b); return s; };
  const arr = (n) => { const out = []; for (let k = 0; k < n; k++) out.push(one()); return out; };
  const map = (n) => { const e = []; for (let k = 0; k < n; k++) { const key = one(); e.push([key, one()]); } return new WireMap(e); };
  function one() {
    need(1);
    const b = buf[i++];
    if (b < 0x80) return BigInt(b);
    if (b < 0x90) return map(b & 15);
    if (b < 0xa0) return arr(b & 15);
    if (b < 0xc0) return text(b & 31);
    if (b >= 0xe0) return BigInt(b - 256);
    switch (b) {
      case 0xc0: return null; case 0xc2: return false; case 0xc3: return true;
      case 0xc4: return bytes(Number(uint(1))); case 0xc5: return bytes(Number(uint(2))); case 0xc6: return bytes(Number(uint(4)));
      case 0xc7: case 0xc8: case 0xc9: { const n = Number(uint({ 0xc7: 1, 0xc8: 2, 0xc9: 4 }[b])); const code = Number(BigInt.asIntN(8, uint(1))); return new Ext(code, bytes(n)); }
      case 0xca: { need(4); const v = Buffer.from(buf.subarray(i, i + 4)).readFloatBE(0); i += 4; return new F(v); }
      case 0xcb: { need(8); const v = Buffer.from(buf.subarray(i, i + 8)).readDoubleBE(0); i += 8; return new F(v); }
      case 0xcc: return uint(1); case 0xcd: return uint(2); case 0xce: return uint(4); case 0xcf: return uint(8);
      case 0xd0: return BigInt.asIntN(8, uint(1)); case 0xd1: return BigInt.asIntN(16, uint(2));
      case 0xd2: return BigInt.asIntN(32, uint(4)); case 0xd3: return BigInt.asIntN(64, uint(8));
      case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8: { const n = { 0xd4: 1, 0xd5: 2, 0xd6: 4, 0xd7: 8, 0xd8: 16 }[b]; const code = Number(BigInt.asIntN(8, uint(1))); return new Ext(code, bytes(n)); }
      case 0xd9: return text(Number(uint(1))); case 0xda: return text(Number(uint(2))); case 0xdb: return text(Number(uint(4)));
      case 0xdc: return arr(Number(uint(2))); case 0xdd: return arr(Number(uint(4)));
      case 0xde: return map(Number(uint(2))); case 0xdf: return map(Number(uint(4)));
      default: throw new Invalid("invalid msgpack byte 0x" + b.toString(16));
    }
  }
  const v = one();
  if (i !== buf.length) throw new Invalid("trailing bytes after the msgpack value");
  return v;
}

// --- types from the export ----------------------------------------------------------------------
const spec = parseJson(readFileSync(process.argv[2], "utf8"));
const structs = spec.structs;
const messages = Object.fromEntries(spec.surfaces.frames.messages.map((m) => [m.kind, m]));
const handshakeMessages = Object.fromEntries(spec.surfaces.handshake.messages.filter((m) => m.keys.length).map((m) => [m.name, m]));

function parseType(t) {
  let i = 0;
  function union() {
    const parts = [single()];
    for (;;) { skip(); if (t[i] === "|") { i++; parts.push(single()); } else break; }
    return parts.length === 1 ? parts[0] : { name: "union", args: parts };
  }
  function skip() { while (t[i] === " ") i++; }
  function single() {
    skip();
    const m = /^[A-Za-z_][A-Za-z0-9_]*/.exec(t.slice(i)); i += m[0].length;
    const node = { name: m[0], args: [], variadic: false };
    skip();
    if (t[i] === "[") {
      i++;
      for (;;) {
        skip();
        if (t.startsWith("...", i)) { i += 3; node.variadic = true; } else node.args.push(union());
        skip();
        if (t[i++] === "]") break;
      }
    }
    return node;
  }
  return union();
}
const typeCache = new Map();
const typeOf = (t) => { if (!typeCache.has(t)) typeCache.set(t, parseType(t)); return typeCache.get(t); };

function hasTensor(expr, seen = new Set()) {
  if (["tensor", "ndarray", "nested_tensors"].includes(expr.name)) return true;
  if (expr.args.some((a) => hasTensor(a, seen))) return true;
  const s = structs[expr.name];
  if (s && s.kind === "struct" && !seen.has(s.name)) {
    seen.add(s.name);
    return s.fields.some((f) => hasTensor(typeOf(f.type), seen));
  }
  return false;
}

function defaultOf(f) {
  if (f.default_factory === "list" || f.default_factory === "set") return [];
  if (f.default_factory === "dict") return {};
  return f.default === null ? null : parseJson(f.default);
}

function sameValue(a, b) { return dumpJson(a) === dumpJson(b); }

// --- encode: tagged JSON value -> msgpack data ---------------------------------------------------
function tagged(v) { if (v && typeof v === "object" && !Array.isArray(v) && !(v instanceof F)) { const k = Object.keys(v); if (k.length === 1 && k[0].startsWith("$")) return k[0]; } return null; }

function enc(v, expr) {
  const tag = tagged(v);
  if (tag === "$tensor" || tag === "$ndarray") throw new Unsupported("tensors are not implemented");
  const name = expr.name;
  if (name === "union") {
    if (v === null) return null;
    const errors = [];
    for (const a of expr.args.filter((x) => x.name !== "none")) {
      try { check(v, a); return enc(v, a); } catch (e) { if (e instanceof Unsupported) throw e; errors.push(e.message); }
    }
    throw new Invalid("no member of the union fits: " + errors.join("; "));
  }
  if (name === "any") return plain(v);
  if (v === null) { if (name === "none") return null; throw new Invalid(`None where ${name} is declared`); }
  const s = structs[name];
  if (s && s.kind === "enum") return v;
  if (s) {
    if (typeof v !== "object" || Array.isArray(v)) throw new Invalid(`${name} must be an object`);
    const known = new Set(s.fields.map((f) => f.name));
    for (const k of Object.keys(v)) if (!known.has(k)) throw new Invalid(`${name} has no field ${k}`);
    if (s.encoding === "array" || s.encoding === "tuple") {
      return s.fields.map((f) => {
        if (!(f.name in v) && f.required) throw new Invalid(`${name}.${f.name} is required`);
        return enc(f.name in v ? v[f.name] : defaultOf(f), typeOf(f.type));
      });
    }
    const entries = [];
    for (const f of s.fields) {
      if (!(f.name in v)) { if (f.required) throw new Invalid(`${name}.${f.name} is required`); if (s.omit_defaults) continue; }
      const value = f.name in v ? v[f.name] : defaultOf(f);
      if (s.omit_defaults && !f.required && sameValue(value, defaultOf(f))) continue;
      entries.push([f.name, enc(value, typeOf(f.type))]);
    }
    return new WireMap(entries, s.omit_defaults ? s.fields.length : entries.length);
  }
  if (name === "int") { if (typeof v !== "bigint") throw new Invalid("expected an int"); return v; }
  if (name === "float") { if (typeof v === "bigint") return new F(Number(v)); if (v instanceof F) return v; if (tag === "$float") return new F(Number(v.$float.replace("inf", "Infinity"))); throw new Invalid("expected a float"); }
  if (name === "str") { if (typeof v !== "string") throw new Invalid("expected a str"); return v; }
  if (name === "bool") { if (typeof v !== "boolean") throw new Invalid("expected a bool"); return v; }
  if (name === "bytes") { if (tag !== "$bytes") throw new Invalid("expected bytes"); return Uint8Array.from(Buffer.from(v.$bytes, "hex")); }
  if (name === "slice") { if (tag !== "$slice") throw new Invalid("expected a slice"); return v.$slice; }
  if (name === "list" || name === "set" || (name === "tuple" && expr.variadic)) {
    const items = tag === "$set" ? v.$set : v;
    if (!Array.isArray(items)) throw new Invalid(`expected a ${name}`);
    return items.map((x) => enc(x, expr.args[0]));
  }
  if (name === "tuple") {
    if (!Array.isArray(v) || v.length !== expr.args.length) throw new Invalid(`expected a tuple of ${expr.args.length}`);
    return v.map((x, k) => enc(x, expr.args[k]));
  }
  if (name === "dict") {
    const pairs = tag === "$map" ? v.$map : Object.entries(v);
    return new WireMap(pairs.map(([k, x]) => [enc(k, expr.args[0]), enc(x, expr.args[1])]));
  }
  if (name === "none") throw new Invalid("expected None");
  throw new Unsupported(`type ${name} is not implemented`);
}

function check(v, expr) { enc(v, expr); }

function plain(v) {
  // an untyped value (any): its JSON shape decides
  const tag = tagged(v);
  if (v === null || typeof v === "bigint" || typeof v === "boolean" || typeof v === "string" || v instanceof F) return v;
  if (tag === "$float") return new F(Number(v.$float.replace("inf", "Infinity")));
  if (tag === "$bytes") return Uint8Array.from(Buffer.from(v.$bytes, "hex"));
  if (tag === "$set") return v.$set.map(plain);
  if (tag === "$map") return new WireMap(v.$map.map(([k, x]) => [plain(k), plain(x)]));
  if (tag) throw new Unsupported(`${tag} is not implemented`);
  if (Array.isArray(v)) return v.map(plain);
  return new WireMap(Object.entries(v).map(([k, x]) => [k, plain(x)]));
}

// --- decode: msgpack data -> tagged JSON value, with vLLM's typing ------------------------------
function dec(raw, expr, path) {
  const name = expr.name;
  const bad = (what) => { throw new Invalid(`Expected \`${what}\`, got \`${kindOf(raw)}\` - at \`${path}\``); };
  if (raw instanceof Ext) { if (raw.code === 3) throw new Unsupported("inline tensor data is not implemented"); // The export's codes: 1 and 2 are pickles (refused without insecure serialization),
    // any code it does not list is unknown.
    const known = String(raw.code) in spec.wire_encoding.msgpack.ext.codes;
    throw new Invalid(`extension type ${raw.code} is not supported - at \`${path}\``,
                      known ? "tensors.ext-pickle-opt-in" : "tensors.ext-codes-known"); }
  if (name === "any") return json(raw, path);
  if (name === "union") {
    if (raw === null) { if (expr.args.some((a) => a.name === "none" || a.name === "any")) return null; bad("not null"); }
    const errors = [];
    for (const a of expr.args.filter((x) => x.name !== "none")) {
      try { return dec(raw, a, path); } catch (e) { if (e instanceof Unsupported) throw e; errors.push(e); }
    }
    // The first member's error, with the clause it names.
    throw errors[0] || new Invalid(`no union member fits - at \`${path}\``);
  }
  if (raw === null) { if (name === "none") return null; bad(name); }
  const s = structs[name];
  if (s && s.kind === "enum") {
    if (!s.members.some((m) => sameValue(m.value, raw))) throw new Invalid(`Invalid enum value ${dumpJson(raw)} - at \`${path}\``);
    return raw;
  }
  if (s) {
    const out = {};
    if (s.encoding === "array" || s.encoding === "tuple") {
      if (!Array.isArray(raw)) bad("array");
      const required = s.fields.filter((f) => f.required).length;
      if (raw.length < required) throw new Invalid(`Expected \`array\` of at least length ${required}, got ${raw.length} - at \`${path}\``);
      if (s.encoding === "tuple" && raw.length > s.fields.length) throw new Invalid(`Expected \`array\` of length ${s.fields.length} - at \`${path}\``);
      s.fields.forEach((f, k) => { out[f.name] = k < raw.length ? dec(raw[k], typeOf(f.type), `${path}[${k}]`) : defaultOf(f); });
      // structs.utility-result.type-info-insecure-only: without insecure serialization a
      // UtilityResult's type_info is nil (it would name a class to import).
      if (name === "UtilityResult" && out.type_info !== null) throw new Invalid(`type_info must be nil without insecure serialization - at \`${path}[0]\``, "structs.utility-result.type-info-insecure-only");
      return out;
    }
    if (!(raw instanceof WireMap)) bad("object");
    const got = new Map();
    for (const [k, x] of raw.entries) { if (typeof k !== "string") throw new Invalid(`Expected \`str\` - at \`key\` in \`${path}\``); got.set(k, x); }
    for (const f of s.fields) {
      if (got.has(f.name)) out[f.name] = dec(got.get(f.name), typeOf(f.type), `${path}.${f.name}`);
      else if (f.required) throw new Invalid(`Object missing required field \`${f.name}\` - at \`${path}\``, "structs.map.absent-key-default");
      else out[f.name] = defaultOf(f);
    }
    return out;
  }
  if (name === "int") { if (typeof raw !== "bigint") bad("int"); return raw; }
  if (name === "float") { if (typeof raw === "bigint") return new F(Number(raw)); if (!(raw instanceof F)) bad("float"); return raw; }
  if (name === "str") { if (typeof raw !== "string") bad("str"); return raw; }
  if (name === "bool") { if (typeof raw !== "boolean") bad("bool"); return raw; }
  if (name === "bytes") { if (!(raw instanceof Uint8Array)) bad("bytes"); return { $bytes: Buffer.from(raw).toString("hex") }; }
  if (name === "slice") { if (!Array.isArray(raw) || raw.length !== 3) bad("array"); return { $slice: raw }; }
  if (name === "list" || name === "set" || (name === "tuple" && expr.variadic)) {
    if (!Array.isArray(raw)) bad("array");
    const items = raw.map((x, k) => dec(x, expr.args[0], `${path}[${k}]`));
    return name === "set" ? { $set: items } : items;
  }
  if (name === "tuple") {
    if (!Array.isArray(raw)) bad("array");
    if (raw.length !== expr.args.length) throw new Invalid(`Expected \`array\` of length ${expr.args.length}, got ${raw.length} - at \`${path}\``);
    return raw.map((x, k) => dec(x, expr.args[k], `${path}[${k}]`));
  }
  if (name === "dict") {
    if (!(raw instanceof WireMap)) bad("object");
    const pairs = raw.entries.map(([k, x]) => [dec(k, expr.args[0], `${path}[...]`), dec(x, expr.args[1], `${path}[...]`)]);
    return pairs.every(([k]) => typeof k === "string" && !k.startsWith("$")) ? Object.fromEntries(pairs) : { $map: pairs };
  }
  if (name === "none") bad("null");
  throw new Unsupported(`type ${name} is not implemented`);
}

function kindOf(raw) {
  if (raw === null) return "null"; if (typeof raw === "bigint") return "int"; if (raw instanceof F) return "float";
  if (typeof raw === "string") return "str"; if (typeof raw === "boolean") return "bool"; if (raw instanceof Uint8Array) return "bytes";
  if (Array.isArray(raw)) return "array"; if (raw instanceof WireMap) return "object"; return "ext";
}

function json(raw, path) {
  if (raw instanceof Ext) return dec(raw, { name: "none", args: [] }, path);
  if (raw instanceof Uint8Array) return { $bytes: Buffer.from(raw).toString("hex") };
  if (Array.isArray(raw)) return raw.map((x, k) => json(x, `${path}[${k}]`));
  if (raw instanceof WireMap) {
    const pairs = raw.entries.map(([k, x]) => [json(k, path), json(x, path)]);
    return pairs.every(([k]) => typeof k === "string" && !k.startsWith("$")) ? Object.fromEntries(pairs) : { $map: pairs };
  }
  if (raw instanceof F && !Number.isFinite(raw.v)) return { $float: Number.isNaN(raw.v) ? "nan" : raw.v > 0 ? "inf" : "-inf" };
  return raw;
}

// --- frames -----------------------------------------------------------------------------------
const hex = (b) => Buffer.from(b).toString("hex");

function encodeKind(kind, value) {
  const message = messages[kind];
  if (!message) {
    const expr = typeOf(kind);
    if (!structs[kind] || hasTensor(expr)) throw new Unsupported(`kind ${kind}`);
    const out = []; pack(enc(value, expr), out); return [hex(out)];
  }
  const frames = [];
  for (const frame of message.frames) {
    if (frame.repeated) continue; // no out-of-band buffers without tensors
    if (frame.content === "type_byte" || frame.content === "literal") frames.push(frame.literal_hex);
    else if (frame.content === "msgpack") {
      const out = []; pack(enc(value, typeOf(frame.payload)), out); frames.push(hex(out));
    } else throw new Unsupported(`frame ${frame.content}`);
  }
  return frames;
}

function decodeKind(kind, frames) {
  const bufs = frames.map((f) => Buffer.from(f, "hex"));
  const message = messages[kind];
  if (!message) {
    if (!structs[kind] || structs[kind].kind !== "struct") throw new Unsupported(`kind ${kind}`);
    if (bufs.length > 1) throw new Unsupported("out-of-band buffers are not implemented");
    return dec(unpack(bufs[0]), typeOf(kind), "$");
  }
  const fixed = message.frames.filter((f) => !f.repeated);
  const repeated = message.frames.some((f) => f.repeated);
  // The sentinel's clause covers its whole form (one frame, exactly those bytes).
  const countClause = kind === "engine_core_dead" ? "frames.engine-core-dead-literal" : "frames.frame-count";
  if (bufs.length < fixed.length) throw new Invalid(`${kind} has ${fixed.length} frames, got ${bufs.length}`, countClause);
  if (bufs.length > fixed.length) {
    if (repeated) throw new Unsupported("out-of-band buffers are not implemented");
    throw new Invalid(`${kind} has ${fixed.length} frames, got ${bufs.length}`, countClause);
  }
  let value = null;
  const handshake = handshakeMessages[kind.toUpperCase()];
  fixed.forEach((frame, k) => {
    if (frame.content === "type_byte" || frame.content === "literal") {
      if (hex(bufs[k]) !== frame.literal_hex) {
        const clause = frame.content === "literal"
          ? (kind === "engine_core_dead" ? "frames.engine-core-dead-literal" : "frames.frame-count")
          : (bufs[k].length === 1 ? "request_types.unknown-byte-rejected" : "request_types.one-byte-frame");
        throw new Invalid(`frame ${k} must be ${frame.literal_hex}`, clause);
      }
    } else if (frame.content === "msgpack") {
      value = dec(unpack(bufs[k]), typeOf(frame.payload), "$");
    } else throw new Unsupported(`frame ${frame.content}`);
  });
  if (handshake) {
    // HELLO and READY are untyped maps: vLLM reads the keys the handshake surface lists.
    for (const key of handshake.keys) {
      if (!(key.name in value)) {
        if (key.required) throw new Invalid(`${kind} is missing the key ${key.name}`, "handshake.message-keys");
        continue;
      }
      dec(plain(value[key.name]), typeOf(key.type), `$.${key.name}`);
      if (key.value !== null && value[key.name] !== key.value) throw new Invalid(`${kind}: ${key.name} must be ${key.value}`, "handshake.message-keys");
    }
  }
  return value;
}

// --- the line protocol ------------------------------------------------------------------------
const lines = createInterface({ input: process.stdin });
lines.on("line", (line) => {
  const request = parseJson(line);
  let answer;
  try {
    // hello: the codec's declaration. JS_CODEC_ROLE=frontend|engine declares one side only.
    if (request.op === "hello") answer = { ok: true, role: process.env.JS_CODEC_ROLE || "both", unsupported: [] };
    else if (request.threshold !== null && request.threshold !== undefined) throw new Unsupported("a custom threshold");
    else if (request.op === "encode") answer = { ok: true, frames: encodeKind(request.kind, request.value) };
    else if (request.op === "decode") answer = { ok: true, value: decodeKind(request.kind, request.frames) };
    else throw new Unsupported(`op ${request.op}`);
  } catch (e) {
    const kind = e instanceof Unsupported ? "unsupported" : "error";
    answer = { ok: false, kind, error: String(e && e.message || e), clause: (e instanceof Invalid && e.clause) || null };
  }
  process.stdout.write(dumpJson({ seq: request.seq, ...answer }) + "\n");
});
