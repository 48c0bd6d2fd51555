-- leasehold PostgreSQL schema, version 12: enqueue from SQL.
--
-- `leasehold_enqueue(plan_id, input, order_key, enqueue_key, after_ms)` enqueues an
-- `execute` attempt of a plan inside the caller's own transaction, from any language
-- or tool that speaks SQL: a trigger, a stored procedure, an application without the
-- Rust library. It writes exactly the rows `Outbox::enqueue_postgres_with` writes —
-- the attempt, its receipts and its command — with the same keys and fingerprints:
-- a template's input is checked against its `[input]` table and frozen on the
-- attempt as canonical JSON, each step's payload is resolved from it, an order key
-- makes the attempt wait behind an open one, an enqueue key answers the attempt the
-- same request enqueued before. Ids are random and times are the database's clock.
-- It locks the plan row first, as the ledger does, and sends the workers' wake-up,
-- which PostgreSQL delivers only if the caller commits. A refusal raises an error
-- (SQLSTATE 22023 bad input, 55000 refused by a guard, P0002 no such plan) whose
-- message is the one the ledger gives, and writes nothing:
--
--     SELECT * FROM leasehold_enqueue('pln-…', '{"order": 7}', 'user-1', 'k-1');
--
-- `plan.targets_json` holds each step's target as a JSON array of strings, in step
-- order (an `http:v1` step's is `scheme://host:port` of its URL, which SQL cannot
-- derive), written when a plan is registered. NULL on plans registered before this
-- version: their steps' targets are read from the steps, and a plan with an
-- `http:v1` step must be registered again before SQL can enqueue it.
--
-- The functions it calls are named `leasehold_…` too. The ledger's tables are found
-- on the caller's search_path, as the Rust ledger finds them. Nothing needs an
-- extension: `sha256(bytea)` and `gen_random_uuid()` are core since PostgreSQL 13.
-- Input is read as `json`, not `jsonb`, which would lose how its numbers are
-- written; a string holding U+0000, which PostgreSQL text cannot hold, is refused.
ALTER TABLE plan ADD COLUMN targets_json TEXT COLLATE "C";

-- The lowercase hex SHA-256 of a text's UTF-8 bytes.
CREATE OR REPLACE FUNCTION leasehold_sha256_hex(data text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT
AS $$
    SELECT encode(sha256(convert_to(data, 'UTF8')), 'hex')
$$;

-- Whether a JSON number, as written, is an integer to serde_json: a literal without
-- fraction or exponent within i64 or u64. `-0` is not: serde_json reads it as the
-- float -0.0.
CREATE OR REPLACE FUNCTION leasehold_json_is_integer(num text) RETURNS boolean
    LANGUAGE sql IMMUTABLE STRICT
AS $$
    SELECT CASE
        WHEN num ~ '^(0|-?[1-9][0-9]{0,17})$' THEN true
        WHEN num !~ '^-?[1-9][0-9]{18,19}$' THEN false
        ELSE num::numeric BETWEEN -9223372036854775808 AND 18446744073709551615
    END
$$;

-- An f64 as Rust prints it (`Display` of serde_json's Number): its shortest
-- round-trip digits d, the value being 0.d × 10^k, laid out as `0.000ddd` for
-- -5 < k ≤ 0, `ddd00.0` or `dd.ddd` for 0 < k ≤ 16, else `d.ddde+X` / `d.ddde-X`.
--
-- PostgreSQL prints the shortest digits when extra_float_digits ≥ 1 (the default;
-- pinned otherwise), but its Ryu never takes a bound of the rounding interval,
-- which Rust's does when the mantissa is even (a decimal halfway between two f64
-- reads back as the even one). Such a bound can have fewer digits only when it is
-- an integer, |f| > 2^53: then the bound of fewer digits is printed.
CREATE OR REPLACE FUNCTION leasehold_format_float(f float8) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT
AS $$
DECLARE
    parts text[];
    all_digits text;
    significant text;
    digits text;
    k integer;
    n integer;
    sign text := CASE WHEN f < 0 THEN '-' ELSE '' END;
    bits bigint;
    mantissa numeric;
    half_ulp numeric;
    square numeric;
    e integer;
    bound numeric;
BEGIN
    IF current_setting('extra_float_digits')::integer >= 1 THEN
        parts := regexp_match(abs(f)::text, '^([0-9]+)(?:[.]([0-9]+))?(?:e([+-][0-9]+))?$');
    ELSE
        parts := regexp_match(leasehold_float_text(abs(f)), '^([0-9]+)(?:[.]([0-9]+))?(?:e([+-][0-9]+))?$');
    END IF;
    all_digits := parts[1] || coalesce(parts[2], '');
    significant := ltrim(all_digits, '0');
    k := length(parts[1]) - (length(all_digits) - length(significant)) + coalesce(parts[3], '0')::integer;
    digits := rtrim(significant, '0');

    IF abs(f) > 9007199254740992 THEN
        bits := ('x' || encode(float8send(f), 'hex'))::bit(64)::bigint & 9223372036854775807;
        mantissa := (bits & 4503599627370495) + 4503599627370496;   -- the 52 stored bits and the implicit 1
        IF mantissa % 2 = 0 THEN
            -- |f| = mantissa × 2^e with e ≥ 2; the bounds are half an ulp away (a
            -- quarter below, at a power of two). half_ulp = 2^(e-1), squared up in
            -- numeric, whose integer products are exact.
            half_ulp := 1;
            square := 2;
            e := (bits >> 52)::integer - 1076;
            WHILE e > 0 LOOP
                IF e % 2 = 1 THEN
                    half_ulp := half_ulp * square;
                END IF;
                square := square * square;
                e := e / 2;
            END LOOP;
            -- The lower one first: on equal length it is never the farther.
            FOREACH bound IN ARRAY ARRAY[
                mantissa * 2 * half_ulp
                    - CASE WHEN mantissa = 4503599627370496 THEN div(half_ulp, 2) ELSE half_ulp END,
                mantissa * 2 * half_ulp + half_ulp] LOOP
                IF length(rtrim(bound::text, '0')) < length(digits) THEN
                    digits := rtrim(bound::text, '0');
                    k := length(bound::text);
                END IF;
            END LOOP;
        END IF;
    END IF;

    n := length(digits);
    IF k > -5 AND k <= 16 THEN
        IF k <= 0 THEN
            RETURN sign || '0.' || repeat('0', -k) || digits;
        ELSIF k >= n THEN
            RETURN sign || digits || repeat('0', k - n) || '.0';
        END IF;
        RETURN sign || left(digits, k) || '.' || substr(digits, k + 1);
    END IF;
    RETURN sign || left(digits, 1) || CASE WHEN n > 1 THEN '.' || substr(digits, 2) ELSE '' END
        || 'e' || CASE WHEN k - 1 < 0 THEN '-' ELSE '+' END || abs(k - 1)::text;
END
$$;

-- float8 text with the shortest round-trip digits, whatever the caller's
-- extra_float_digits (leasehold_format_float calls it only when that is below 1).
CREATE OR REPLACE FUNCTION leasehold_float_text(f float8) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT
    SET extra_float_digits = 1
AS $$
    SELECT f::text
$$;

-- The canonical text of a JSON number, from its text as written: an integer literal
-- within i64 or u64 as it is; any other number read as the nearest f64 (as
-- serde_json reads it), printed as integer text when it is integral within ±2^53
-- (`1.0` is `1`, `-0` is `0`), else as Rust prints an f64 (leasehold_format_float).
-- A number beyond f64 is refused; one that rounds to zero is 0.
CREATE OR REPLACE FUNCTION leasehold_json_number(num text) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT
AS $$
DECLARE
    f float8;
    parts text[];
    all_digits text;
    significant text;
    magnitude numeric;
BEGIN
    IF leasehold_json_is_integer(num) THEN
        RETURN num;
    END IF;
    -- The value is 0.d × 10^magnitude (d its significant digits as written). The
    -- cast raises beyond f64 and on an underflow to zero, which only the last
    -- decade at each end of the range may hold.
    parts := regexp_match(num, '^-?([0-9]+)(?:[.]([0-9]+))?(?:[eE]([+-]?[0-9]+))?$');
    IF parts IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format('%s is not a JSON number', num);
    END IF;
    all_digits := parts[1] || coalesce(parts[2], '');
    significant := ltrim(all_digits, '0');
    IF significant = '' THEN
        RETURN '0';
    END IF;
    magnitude := length(parts[1]) - (length(all_digits) - length(significant)) + coalesce(parts[3], '0')::numeric;
    IF magnitude > 309 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'number out of range';
    ELSIF magnitude < -323 THEN
        RETURN '0';
    ELSIF magnitude > -323 AND magnitude < 309 THEN
        f := num::float8;
    ELSE
        BEGIN
            f := num::float8;
        EXCEPTION WHEN numeric_value_out_of_range THEN
            IF magnitude > 0 THEN
                RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'number out of range';
            END IF;
            RETURN '0';
        END;
    END IF;
    IF f = trunc(f) AND abs(f) <= 9007199254740992 THEN
        RETURN f::bigint::text;
    END IF;
    RETURN leasehold_format_float(f);
END
$$;

-- The members of a JSON object, each key once: where the text repeats a key, the
-- last one wins (as serde_json reads it).
CREATE OR REPLACE FUNCTION leasehold_json_members(object json) RETURNS TABLE (key text, value json)
    LANGUAGE sql IMMUTABLE
AS $$
    SELECT DISTINCT ON (e.key COLLATE "C") e.key, e.value
    FROM json_each(object) WITH ORDINALITY AS e(key, value, n)
    ORDER BY e.key COLLATE "C", e.n DESC
$$;

-- Canonical JSON (engine/src/canonical.rs): no whitespace, object keys sorted by
-- their UTF-8 bytes (the "C" collation), strings escaped as serde_json escapes them
-- (which `to_json(text)` does), numbers by leasehold_json_number.
CREATE OR REPLACE FUNCTION leasehold_canonical_json(value json) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT
AS $$
DECLARE
    out text;
BEGIN
    CASE json_typeof(value)
    WHEN 'object' THEN
        SELECT '{' || coalesce(string_agg(to_json(m.key)::text || ':' || leasehold_canonical_member(m.value), ','
                                          ORDER BY m.key COLLATE "C"), '') || '}'
        INTO out FROM leasehold_json_members(value) AS m;
    WHEN 'array' THEN
        SELECT '[' || coalesce(string_agg(leasehold_canonical_member(e.value), ',' ORDER BY e.n), '') || ']'
        INTO out FROM json_array_elements(value) WITH ORDINALITY AS e(value, n);
    ELSE
        out := leasehold_canonical_member(btrim(value::text, E' \t\n\r')::json);
    END CASE;
    RETURN out;
END
$$;

-- leasehold_canonical_json of a value without surrounding whitespace (an object's
-- member or an array's item): scalars here, without a call of their own. STABLE
-- (as `to_json` is declared), not IMMUTABLE, so that PostgreSQL inlines it into
-- the query that walks the container.
CREATE OR REPLACE FUNCTION leasehold_canonical_member(value json) RETURNS text
    LANGUAGE sql STABLE
AS $$
    SELECT CASE json_typeof(value)
        WHEN 'string' THEN to_json(value #>> '{}')::text
        WHEN 'number' THEN leasehold_json_number(value::text)
        WHEN 'object' THEN leasehold_canonical_json(value)
        WHEN 'array' THEN leasehold_canonical_json(value)
        ELSE value::text   -- true, false, null
    END
$$;

-- The JSON type of a value as the ledger's messages name it: null, boolean,
-- integer, number, string, array or object.
CREATE OR REPLACE FUNCTION leasehold_json_type(value json) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT
AS $$
    SELECT CASE json_typeof(value)
        WHEN 'number' THEN
            CASE WHEN leasehold_json_is_integer(btrim(value::text, E' \t\n\r')) THEN 'integer' ELSE 'number' END
        ELSE json_typeof(value)
    END
$$;

-- Why a name or key may not hold the character with code point `cp`
-- (engine/src/names.rs): 'control' (general category Cc), 'invisible' (Cf, Zs but
-- the plain space, Zl, Zp, and the characters that draw nothing or a blank), or NULL.
-- The general categories are those of Unicode 18, as the ledger's tables have them.
CREATE OR REPLACE FUNCTION leasehold_forbidden(cp integer) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT
AS $$
    SELECT CASE
        WHEN cp BETWEEN 32 AND 126 THEN NULL                   -- printable ASCII, the space too
        WHEN cp < 32 OR cp BETWEEN 127 AND 159 THEN 'control'  -- Cc: C0, DEL, C1
        -- Zs: U+00A0 U+1680 U+2000–200A U+202F U+205F U+3000; Zl U+2028, Zp U+2029
        WHEN cp IN (160, 5760, 8239, 8287, 12288, 8232, 8233) OR cp BETWEEN 8192 AND 8202
          -- Cf: U+00AD U+061C U+06DD U+070F U+08E2 U+180E U+FEFF U+110BD U+110CD U+E0001
          OR cp IN (173, 1564, 1757, 1807, 2274, 6158, 65279, 69821, 69837, 917505)
          OR cp BETWEEN 1536 AND 1541       -- Cf: U+0600–0605
          OR cp BETWEEN 2192 AND 2193       -- Cf: U+0890–0891
          OR cp BETWEEN 8203 AND 8207       -- Cf: U+200B–200F
          OR cp BETWEEN 8234 AND 8238       -- Cf: U+202A–202E
          OR cp BETWEEN 8288 AND 8292       -- Cf: U+2060–2064
          OR cp BETWEEN 8294 AND 8303       -- Cf: U+2066–206F
          OR cp BETWEEN 65529 AND 65531     -- Cf: U+FFF9–FFFB
          OR cp BETWEEN 78896 AND 78911     -- Cf: U+13430–1343F
          OR cp BETWEEN 113824 AND 113827   -- Cf: U+1BCA0–1BCA3
          OR cp BETWEEN 119155 AND 119162   -- Cf: U+1D173–1D17A
          OR cp BETWEEN 917536 AND 917631   -- Cf: U+E0020–E007F
          -- drawing nothing or a blank: U+034F U+180F U+2800 U+3164 U+FFA0, U+115F–1160,
          -- the variation selectors U+180B–180D, U+FE00–FE0F, U+E0100–E01EF
          OR cp IN (847, 6159, 10240, 12644, 65440)
          OR cp BETWEEN 4447 AND 4448
          OR cp BETWEEN 6155 AND 6157
          OR cp BETWEEN 65024 AND 65039
          OR cp BETWEEN 917760 AND 917999
          THEN 'invisible'
    END
$$;

-- Refuses an enqueue key or order key (`check_enqueue_key`): 1 to 255 characters,
-- none that a name may not hold; the message names `field`.
CREATE OR REPLACE FUNCTION leasehold_check_key(field text, key text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE STRICT
AS $$
DECLARE
    n integer := char_length(key);
    c text;
    cp integer;
BEGIN
    IF n = 0 OR n > 255 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('%s: %s characters; a key has 1 to 255', field, n);
    END IF;
    IF key ~ '^[ -~]*$' THEN
        RETURN;
    END IF;
    FOREACH c IN ARRAY regexp_split_to_array(key, '') LOOP
        cp := ascii(c);
        CASE leasehold_forbidden(cp)
        WHEN 'control' THEN
            -- Rust's char::escape_default: \t \r \n, else \u{hex}.
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('%s: must not contain control characters (found %s)', field,
                                 CASE cp WHEN 9 THEN E'\\t' WHEN 10 THEN E'\\n' WHEN 13 THEN E'\\r'
                                         ELSE E'\\u{' || to_hex(cp) || '}' END);
        WHEN 'invisible' THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('%s: must not contain invisible or separator characters (found U+%s)', field,
                                 upper(lpad(to_hex(cp), greatest(4, length(to_hex(cp))), '0')));
        ELSE
            NULL;
        END CASE;
    END LOOP;
END
$$;

-- A text as Rust's `{:?}` shows it in a message: quoted, with \\ \" \t \r \n escaped
-- and control, format, separator and private-use characters as \u{hex}.
CREATE OR REPLACE FUNCTION leasehold_debug_text(data text) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT
AS $$
DECLARE
    out text := '';
    c text;
    cp integer;
BEGIN
    IF data ~ E'^[ !#-\\[\\]-~]*$' THEN
        RETURN '"' || data || '"';
    END IF;
    FOREACH c IN ARRAY regexp_split_to_array(data, '') LOOP
        cp := ascii(c);
        out := out || CASE
            WHEN c = E'\\' THEN E'\\\\'
            WHEN c = '"' THEN E'\\"'
            WHEN cp = 9 THEN E'\\t'
            WHEN cp = 10 THEN E'\\n'
            WHEN cp = 13 THEN E'\\r'
            WHEN leasehold_forbidden(cp) IS NOT NULL
              OR cp BETWEEN 57344 AND 63743 OR cp >= 983040   -- private use
              -- the common combining marks (Rust escapes every grapheme extender)
              OR cp BETWEEN 768 AND 879 OR cp BETWEEN 6832 AND 6911 OR cp BETWEEN 7616 AND 7679
              OR cp BETWEEN 8400 AND 8447 OR cp BETWEEN 65056 AND 65071
                THEN E'\\u{' || to_hex(cp) || '}'
            ELSE c
        END;
    END LOOP;
    RETURN '"' || out || '"';
END
$$;

-- Checks a template's input (`check_input`) against its `[input]` table (the plan's
-- input_json): a JSON object of declared fields, each of its type and within its
-- max_bytes, every required field given, at most 65536 bytes as canonical JSON.
-- `input_text` is the input's canonical JSON (leasehold_canonical_json), checked
-- here and returned. Types are read from the input as written (`1.0` is a number,
-- not an integer), sizes from its canonical JSON.
CREATE OR REPLACE FUNCTION leasehold_check_input(schema_json text, input json, input_text text) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT
AS $$
DECLARE
    schema jsonb := schema_json::jsonb;
    canonical json := input_text::json;
    field record;
    declared jsonb;
    found text;
    bytes integer;
    missing text;
BEGIN
    IF json_typeof(input) <> 'object' THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('input: must be a JSON object, not %s', leasehold_json_type(input));
    END IF;
    IF octet_length(input_text) > 65536 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('input: %s bytes exceeds the limit of 65536 bytes', octet_length(input_text));
    END IF;
    -- Field by field in key byte order: the first one at fault is reported.
    FOR field IN SELECT m.key, m.value FROM leasehold_json_members(input) AS m ORDER BY m.key COLLATE "C" LOOP
        declared := schema -> field.key;
        IF declared IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('input.%s: is not a field of the plan''s [input] (fields: %s)', field.key,
                                 (SELECT coalesce(string_agg(s.key, ', ' ORDER BY s.key COLLATE "C"), '')
                                  FROM jsonb_object_keys(schema) AS s(key)));
        END IF;
        found := leasehold_json_type(field.value);
        IF found <> declared ->> 'type' AND NOT (declared ->> 'type' = 'number' AND found = 'integer') THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('input.%s: expected %s, found %s', field.key, declared ->> 'type', found);
        END IF;
        IF declared ? 'max_bytes' THEN
            -- a member of canonical JSON is its value's canonical JSON
            bytes := octet_length((canonical -> field.key)::text);
            IF bytes > (declared ->> 'max_bytes')::numeric THEN
                RAISE EXCEPTION USING ERRCODE = '22023',
                    MESSAGE = format('input.%s: %s bytes exceeds its max_bytes of %s', field.key, bytes,
                                     declared ->> 'max_bytes');
            END IF;
        END IF;
    END LOOP;
    SELECT s.key INTO missing
    FROM jsonb_each(schema) AS s(key, value)
    WHERE coalesce((s.value ->> 'required')::boolean, false)
      AND NOT EXISTS (SELECT 1 FROM json_each(input) AS i WHERE i.key = s.key)
    ORDER BY s.key COLLATE "C"
    LIMIT 1;
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format('input.%s: is required', missing);
    END IF;
    RETURN input_text;
END
$$;

-- What a reference's JSON pointer names in the input (`lookup`, RFC 6901): `""` the
-- whole input; tokens split on `/`, `~1` is `/` and `~0` is `~`; an array index is
-- `0` or a number without leading zeros, in range. Naming nothing: JSON null when
-- the input has no field of the pointer's first token (an optional field left out),
-- else refused, naming the field, the pointer and where the reference stands (`at`).
CREATE OR REPLACE FUNCTION leasehold_input_at(input json, pointer text, at text) RETURNS json
    LANGUAGE plpgsql IMMUTABLE STRICT
AS $$
DECLARE
    cur json := input;
    token text;
    field text;
BEGIN
    IF pointer = '' THEN
        RETURN input;
    END IF;
    IF left(pointer, 1) = '/' THEN
        FOREACH token IN ARRAY regexp_split_to_array(substr(pointer, 2), '/') LOOP
            token := replace(replace(token, '~1', '/'), '~0', '~');
            cur := CASE json_typeof(cur)
                WHEN 'object' THEN cur -> token
                WHEN 'array' THEN
                    CASE WHEN token ~ '^(0|[1-9][0-9]{0,8})$' THEN cur -> token::integer END
            END;
            EXIT WHEN cur IS NULL;
        END LOOP;
        IF cur IS NOT NULL THEN
            RETURN cur;
        END IF;
    END IF;
    field := replace(replace(split_part(ltrim(pointer, '/'), '/', 1), '~1', '/'), '~0', '~');
    IF input -> field IS NULL THEN
        RETURN 'null'::json;
    END IF;
    RAISE EXCEPTION USING ERRCODE = '22023',
        MESSAGE = format('input.%s: %s names nothing in it, and %s refers to it', field,
                         leasehold_debug_text(pointer), at);
END
$$;

-- The canonical JSON of a step's payload with every `{"$input": "<pointer>"}`
-- reference replaced by what it names in the input (`resolve`). `input` is the
-- input's canonical JSON, so what a pointer names in it is canonical JSON already.
-- `at` names where `payload` stands (`steps[0].payload`, then `.key` and `[index]`),
-- for messages. Members are resolved in key byte order, items in order, so the
-- first reference at fault is the one the ledger reports.
CREATE OR REPLACE FUNCTION leasehold_resolve_payload(payload json, input json, at text) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT
AS $$
DECLARE
    member record;
    parts text[] := '{}';
BEGIN
    -- Without the text `"$input"` nor any \u escape (which could spell it), no
    -- reference stands in it.
    IF strpos(payload::text, '"$input"') = 0 AND strpos(payload::text, E'\\u') = 0 THEN
        RETURN leasehold_canonical_json(payload);
    END IF;
    CASE json_typeof(payload)
    WHEN 'object' THEN
        IF EXISTS (SELECT 1 FROM json_each(payload) AS e WHERE e.key = '$input') THEN
            IF (SELECT count(*) FROM leasehold_json_members(payload)) <> 1
               OR json_typeof(payload -> '$input') <> 'string' THEN
                RAISE EXCEPTION USING ERRCODE = '22023',
                    MESSAGE = at || ': a {"$input": …} reference is an object with that one key, '
                              'whose value is a JSON pointer';
            END IF;
            RETURN leasehold_input_at(input, payload ->> '$input', at)::text;
        END IF;
        FOR member IN SELECT m.key, m.value FROM leasehold_json_members(payload) AS m ORDER BY m.key COLLATE "C" LOOP
            parts := parts || (to_json(member.key)::text || ':'
                               || leasehold_resolve_payload(member.value, input, at || '.' || member.key));
        END LOOP;
        RETURN '{' || array_to_string(parts, ',') || '}';
    WHEN 'array' THEN
        FOR member IN SELECT e.value, e.n FROM json_array_elements(payload) WITH ORDINALITY AS e(value, n)
                      ORDER BY e.n LOOP
            parts := parts || leasehold_resolve_payload(member.value, input, format('%s[%s]', at, member.n - 1));
        END LOOP;
        RETURN '[' || array_to_string(parts, ',') || ']';
    ELSE
        RETURN leasehold_canonical_json(payload);
    END CASE;
END
$$;

-- A plan's fingerprint (`plan_fingerprint`): the SHA-256 of the canonical JSON of
-- its content, each optional member only where its column is set.
CREATE OR REPLACE FUNCTION leasehold_plan_fingerprint(
    name text, recovery text, steps_json text, volatile_fields_json text,
    retry_json text, queue text, input_json text, on_failure text
) RETURNS text
    LANGUAGE sql IMMUTABLE
AS $$
    SELECT leasehold_sha256_hex(leasehold_canonical_json((
        '{"name":' || to_json(name)::text
        || ',"recovery":' || to_json(recovery)::text
        || ',"steps":' || steps_json
        || ',"volatile_fields":' || volatile_fields_json
        || coalesce(',"retry":' || retry_json, '')
        || coalesce(',"queue":' || to_json(queue)::text, '')
        || coalesce(',"input":' || input_json, '')
        || coalesce(',"on_failure":' || to_json(on_failure)::text, '')
        || '}')::json))
$$;

-- The SHA-256 of an execute request with an enqueue key (`enqueue_request_sha256`):
-- the plan, the start as asked for (`"now"` or `{"after": ms}`, not the instant it
-- came to) and, for a template, the input's SHA-256 and the order key where given.
CREATE OR REPLACE FUNCTION leasehold_request_sha256(
    plan_id text, input_sha256 text, order_key text, after_ms bigint
) RETURNS text
    LANGUAGE sql IMMUTABLE
AS $$
    SELECT leasehold_sha256_hex(leasehold_canonical_json((
        '{"action":"execute"'
        || coalesce(',"input_sha256":' || to_json(input_sha256)::text, '')
        || coalesce(',"order_key":' || to_json(order_key)::text, '')
        || ',"plan":' || to_json(plan_id)::text
        || ',"start":' || coalesce('{"after":' || after_ms::text || '}', '"now"')
        || '}')::json))
$$;

-- A step's idempotency key: `ik-` and the first 32 hex digits of the SHA-256 of
-- attempt id, ordinal and step code, separated by NUL bytes.
CREATE OR REPLACE FUNCTION leasehold_idempotency_key(attempt_id text, ordinal bigint, step_code text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT
AS $$
    SELECT 'ik-' || left(encode(sha256(convert_to(attempt_id, 'UTF8') || decode('00', 'hex')
                                       || convert_to(ordinal::text, 'UTF8') || decode('00', 'hex')
                                       || convert_to(step_code, 'UTF8')), 'hex'), 32)
$$;

-- An attempt's W3C traceparent when it joins no trace (`TraceContext::for_attempt`):
-- trace id and span id from the SHA-256 of `leasehold attempt trace`, NUL, the
-- attempt id; an all-zero id (invalid in W3C) ends in 01 instead.
CREATE OR REPLACE FUNCTION leasehold_traceparent(attempt_id text) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT
AS $$
DECLARE
    digest bytea := sha256(convert_to('leasehold attempt trace', 'UTF8') || decode('00', 'hex')
                           || convert_to(attempt_id, 'UTF8'));
    trace_id bytea := substr(digest, 1, 16);
    span_id bytea := substr(digest, 17, 8);
BEGIN
    IF trace_id = decode(repeat('00', 16), 'hex') THEN
        trace_id := set_byte(trace_id, 15, 1);
    END IF;
    IF span_id = decode(repeat('00', 8), 'hex') THEN
        span_id := set_byte(span_id, 7, 1);
    END IF;
    RETURN '00-' || encode(trace_id, 'hex') || '-' || encode(span_id, 'hex') || '-01';
END
$$;

-- A new id: `<prefix>-`, the low 48 bits of `now_ms` in 12 hex digits, `-`, 16
-- random hex digits. They come from a version 4 UUID, whose 13th and 17th digits are
-- fixed (version) or half fixed (variant): those two are skipped.
CREATE OR REPLACE FUNCTION leasehold_new_id(prefix text, now_ms bigint) RETURNS text
    LANGUAGE plpgsql VOLATILE STRICT
AS $$
DECLARE
    random_hex text := replace(gen_random_uuid()::text, '-', '');
BEGIN
    RETURN prefix || '-' || lpad(to_hex(now_ms & 281474976710655), 12, '0') || '-'
        || substr(random_hex, 1, 12) || substr(random_hex, 14, 3) || substr(random_hex, 18, 1);
END
$$;

-- Enqueues an `execute` attempt of plan `plan_id` in the caller's transaction (see
-- the top of this file). `input`: a template's input (NULL: `{}`); `order_key`: a
-- template's order key; `enqueue_key`: answers the attempt an earlier enqueue with
-- the same key and request created (created = false, nothing written); `after_ms`:
-- claimable that many milliseconds from now (NULL: at once).
CREATE OR REPLACE FUNCTION leasehold_enqueue(
    plan_id text,
    input json DEFAULT NULL,
    order_key text DEFAULT NULL,
    enqueue_key text DEFAULT NULL,
    after_ms bigint DEFAULT NULL
) RETURNS TABLE (attempt_id text, created boolean)
    LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    -- The arguments under names no column has, for use inside queries.
    the_plan_id text := leasehold_enqueue.plan_id;
    the_order_key text := leasehold_enqueue.order_key;
    the_key text := leasehold_enqueue.enqueue_key;
    p record;
    now_ms bigint;
    is_template boolean;
    input_text text;
    the_input_sha256 text;
    the_request_sha256 text;
    payloads text[] := '{}';
    targets text[] := '{}';
    keyed record;
    open_attempt record;
    computed text;
    step record;
    new_number bigint;
    new_attempt_id text;
    new_command_id text;
    the_available_at bigint;
    constraint_name text;
    detail text;
BEGIN
    -- Input as serde_json would read it: its canonical text, or a refusal of what
    -- serde_json refuses (a number beyond f64) or PostgreSQL text cannot hold.
    IF input IS NOT NULL THEN
        BEGIN
            input_text := leasehold_canonical_json(input);
        EXCEPTION
            WHEN untranslatable_character THEN
                RAISE EXCEPTION USING ERRCODE = '22023',
                    MESSAGE = E'input: a string holds \\u0000, which PostgreSQL text cannot hold';
            WHEN invalid_text_representation OR invalid_parameter_value THEN
                -- a lone surrogate (`\ud800`, serde_json refuses it too), or a number
                -- beyond f64 (leasehold_json_number's refusal)
                GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL;
                RAISE EXCEPTION USING ERRCODE = '22023',
                    MESSAGE = 'input: ' || CASE WHEN detail = '' THEN SQLERRM ELSE rtrim(detail, '.') END;
        END;
    END IF;

    -- 1. The plan, locked: enqueues of one plan are serialized.
    SELECT pl.id, pl.status, pl.name, pl.recovery, pl.steps_json, pl.volatile_fields_json, pl.fingerprint,
           pl.retry_json, pl.queue, pl.input_json, pl.on_failure, pl.targets_json
    INTO p
    FROM plan AS pl
    WHERE pl.id = the_plan_id
    FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'P0002', MESSAGE = format('plan %s not found', the_plan_id);
    END IF;
    -- 2. The ledger's clock (the Rust ledger's `now_ms` for PostgreSQL).
    now_ms := (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT;

    -- 3., 4. Order key; input and order key only for a template.
    IF the_order_key IS NOT NULL THEN
        PERFORM leasehold_check_key('order_key', the_order_key);
    END IF;
    is_template := p.input_json IS NOT NULL;
    IF NOT is_template AND (input IS NOT NULL OR the_order_key IS NOT NULL) THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('%s: plan %s declares no [input], so its attempts take neither input nor an order key',
                             CASE WHEN input IS NOT NULL THEN 'input' ELSE 'order_key' END, p.id);
    END IF;

    -- 5. A template's input, checked, and each step's payload resolved from it (from
    -- its canonical JSON, so resolved numbers are written as they are there).
    IF is_template THEN
        IF input IS NULL THEN
            input := '{}'::json;
            input_text := '{}';
        END IF;
        input_text := leasehold_check_input(p.input_json, input, input_text);
        the_input_sha256 := leasehold_sha256_hex(input_text);
        FOR step IN SELECT s.value, s.n FROM json_array_elements(p.steps_json::json) WITH ORDINALITY AS s(value, n)
                    ORDER BY s.n LOOP
            computed := leasehold_resolve_payload(coalesce(step.value -> 'payload', '{}'::json), input_text::json,
                                                  format('steps[%s].payload', step.n - 1));
            IF octet_length(computed) > 65536 THEN
                RAISE EXCEPTION USING ERRCODE = '22023',
                    MESSAGE = format('steps[%s].payload: %s bytes once resolved from the input exceeds the limit '
                                     'of 65536 bytes', step.n - 1, octet_length(computed));
            END IF;
            payloads := payloads || computed;
        END LOOP;
    END IF;

    -- 6. An enqueue key names one request: the same one answers its attempt as it is
    -- now, writing nothing; another is refused.
    IF the_key IS NOT NULL THEN
        PERFORM leasehold_check_key('enqueue key', the_key);
        the_request_sha256 := leasehold_request_sha256(p.id, the_input_sha256,
                                                       CASE WHEN is_template THEN the_order_key END,
                                                       leasehold_enqueue.after_ms);
        SELECT a.id, a.request_sha256 INTO keyed FROM attempt AS a WHERE a.enqueue_key = the_key;
        IF FOUND THEN
            IF keyed.request_sha256 IS NOT DISTINCT FROM the_request_sha256 THEN
                attempt_id := keyed.id;
                created := false;
                RETURN NEXT;
                RETURN;
            END IF;
            RAISE EXCEPTION USING ERRCODE = '55000',
                MESSAGE = format('enqueue key %s was used by another request (attempt %s): a key names one request',
                                 leasehold_debug_text(the_key), keyed.id);
        END IF;
    END IF;

    -- 7. The plan accepts attempts: READY, its content matching its fingerprint.
    IF p.status <> 'READY' THEN
        RAISE EXCEPTION USING ERRCODE = '55000', MESSAGE = format('execute refused: plan %s is %s', p.id, p.status);
    END IF;
    computed := leasehold_plan_fingerprint(p.name, p.recovery, p.steps_json, p.volatile_fields_json, p.retry_json,
                                           p.queue, p.input_json, p.on_failure);
    IF computed <> p.fingerprint THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = format('execute refused: plan %s: fingerprint: stored %s but the content hashes to %s',
                             p.id, p.fingerprint, computed);
    END IF;

    -- 8. A plan without input runs one attempt at a time.
    IF NOT is_template THEN
        SELECT a.id, a.status INTO open_attempt
        FROM attempt AS a
        WHERE a.plan_id = p.id AND a.status IN ('QUEUED', 'RUNNING')
        ORDER BY a.number
        LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION USING ERRCODE = '55000',
                MESSAGE = format('execute refused: attempt %s is still %s', open_attempt.id, open_attempt.status);
        END IF;
    END IF;

    -- Each step's target: as stored at registration, or for a plan registered before
    -- targets were stored, its `target` or its executor (an http:v1 step's target
    -- comes from its URL, which only the registration derives).
    IF p.targets_json IS NOT NULL THEN
        SELECT coalesce(array_agg(t.value ORDER BY t.n), '{}') INTO targets
        FROM json_array_elements_text(p.targets_json::json) WITH ORDINALITY AS t(value, n);
        IF cardinality(targets) <> json_array_length(p.steps_json::json) THEN
            RAISE EXCEPTION USING ERRCODE = '55000',
                MESSAGE = format('ledger integrity: plan %s: targets_json holds %s targets for %s steps', p.id,
                                 cardinality(targets), json_array_length(p.steps_json::json));
        END IF;
    ELSE
        IF EXISTS (SELECT 1 FROM json_array_elements(p.steps_json::json) AS s(value)
                   WHERE s.value ->> 'executor' = 'http:v1') THEN
            RAISE EXCEPTION USING ERRCODE = '55000',
                MESSAGE = format('plan %s was registered before its targets were stored: register it again', p.id);
        END IF;
        SELECT coalesce(array_agg(coalesce(s.value ->> 'target', s.value ->> 'executor') ORDER BY s.n), '{}')
        INTO targets
        FROM json_array_elements(p.steps_json::json) WITH ORDINALITY AS s(value, n);
    END IF;

    -- 9. The next attempt number.
    SELECT coalesce(max(a.number), 0) + 1 INTO new_number FROM attempt AS a WHERE a.plan_id = p.id;

    -- 10. Ids.
    new_attempt_id := leasehold_new_id('att', now_ms);
    new_command_id := leasehold_new_id('cmd', now_ms);

    -- 11. The rows.
    IF leasehold_enqueue.after_ms < 0 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'after_ms: must not be negative';
    END IF;
    -- now + after_ms, saturating at the largest timestamp as the ledger's does.
    the_available_at := CASE
        WHEN leasehold_enqueue.after_ms IS NULL THEN now_ms
        WHEN leasehold_enqueue.after_ms > 9223372036854775807 - now_ms THEN 9223372036854775807
        ELSE now_ms + leasehold_enqueue.after_ms
    END;

    BEGIN
        INSERT INTO attempt (id, plan_id, number, action, status, created_at, traceparent, enqueue_key,
                             request_sha256, input_json, input_sha256, order_key)
        VALUES (new_attempt_id, p.id, new_number, 'execute', 'QUEUED', now_ms, leasehold_traceparent(new_attempt_id),
                the_key, the_request_sha256, input_text, the_input_sha256,
                CASE WHEN is_template THEN the_order_key END);
    EXCEPTION WHEN unique_violation THEN
        GET STACKED DIAGNOSTICS constraint_name = CONSTRAINT_NAME;
        IF constraint_name = 'attempt_by_plan_number' THEN
            -- A REPEATABLE READ (or SERIALIZABLE) snapshot taken before another
            -- transaction's enqueue of this plan committed: its attempt was not seen.
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('plan %s: this transaction''s snapshot predates attempt %s (another session '
                                 'committed it after the snapshot was taken), so nothing was enqueued: enqueue '
                                 'before the transaction''s other reads, or use READ COMMITTED, and run the '
                                 'transaction again', p.id, new_number);
        END IF;
        RAISE;
    END;

    FOR step IN SELECT s.value, s.n FROM json_array_elements(p.steps_json::json) WITH ORDINALITY AS s(value, n)
                ORDER BY s.n LOOP
        INSERT INTO receipt (attempt_id, ordinal, step_code, idempotency_key, status, executor, target, payload)
        VALUES (new_attempt_id, step.n, step.value ->> 'code',
                leasehold_idempotency_key(new_attempt_id, step.n, step.value ->> 'code'), 'PENDING',
                step.value ->> 'executor', targets[step.n], payloads[step.n]);
    END LOOP;

    INSERT INTO command (id, attempt_id, status, available_at, delivery_count, queue, executor, target)
    VALUES (new_command_id, new_attempt_id,
            -- WAITING behind an open attempt of the plan with the same order key.
            CASE WHEN is_template AND the_order_key IS NOT NULL AND EXISTS (
                     SELECT 1 FROM attempt AS a
                     WHERE a.plan_id = p.id AND a.order_key = the_order_key AND a.id <> new_attempt_id
                       AND a.status IN ('QUEUED', 'RUNNING'))
                 THEN 'WAITING' ELSE 'PENDING' END,
            the_available_at, 0, coalesce(p.queue, 'default'),
            coalesce(p.steps_json::json -> 0 ->> 'executor', ''), coalesce(targets[1], ''));

    -- 12. Wake idle workers when the caller commits.
    PERFORM pg_notify('leasehold_work', '');

    -- 13.
    attempt_id := new_attempt_id;
    created := true;
    RETURN NEXT;
END
$$;
