-- leasehold MySQL / MariaDB schema, version 13: enqueue from SQL.
--
-- An application that keeps its own rows in the ledger's database can enqueue an
-- attempt in its own transaction without the Rust library:
--
--     CALL leasehold_enqueue('pln-...', '{"order": 7}', 'user-1', 'k-1', NULL,
--                            @attempt_id, @created);
--
-- enqueues an execute attempt of the plan (the arguments: the plan id; a
-- template's input, JSON text, NULL for `{}`; its order key; an enqueue key; a
-- delay in milliseconds, NULL for none) and writes exactly the rows the Rust
-- outbox writes: the attempt, one receipt per step and the command, with ids of
-- the same form, the same idempotency keys, trace context and fingerprints, at the
-- database clock's time. @created is 0 when the enqueue key names an attempt that
-- the same request created before; nothing is written then. A refusal is SQLSTATE
-- 22023 (bad input, key or order key), 55000 (refused by a guard) or P0002 (no
-- such plan), with the Rust ledger's message cut to 128 characters. Every check
-- comes before the first write, and a write that fails takes back what the call
-- wrote, so a refusal leaves the caller's own writes as they were. The routines
-- run with the caller's privileges (those the Rust outbox needs, and DELETE on
-- attempt, receipt and command to take a failed write back) and change no
-- session variable.
--
-- `plan.targets_json` holds the target of each step, in order (a JSON array of
-- strings): an http:v1 step's is its URL's scheme, host and port, which the
-- ledger derives at registration and SQL cannot. NULL on plans registered before
-- this version: a step's target is then its `target` or its executor, and a plan
-- with an http:v1 step is refused until it is registered again.
--
-- The JSON work (canonical JSON, the input's checks, the payloads resolved from
-- it, the plan's fingerprint) is done by the `leasehold_json_*` routines on the
-- text itself, as serde_json reads it: the server's JSON functions keep the first
-- of duplicate keys where serde_json keeps the last, garble escaped characters
-- beyond U+FFFF and stop at 32 levels of nesting (serde_json at 128).
-- Numbers keep their spelling until they are written in canonical form; object
-- keys sort by their UTF-8 bytes.
ALTER TABLE plan ADD COLUMN targets_json MEDIUMTEXT NULL;

DELIMITER $$

-- Refuses with `state` and `message`, cut to the 128 characters a MESSAGE_TEXT holds.
DROP PROCEDURE IF EXISTS leasehold_raise $$
CREATE PROCEDURE leasehold_raise(IN state CHAR(5), IN message LONGTEXT CHARACTER SET utf8mb4)
    NO SQL SQL SECURITY INVOKER
BEGIN
    DECLARE m VARCHAR(128) CHARACTER SET utf8mb4 DEFAULT LEFT(COALESCE(message, ''), 128);
    CASE state
        WHEN '22023' THEN SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = m;
        WHEN '55000' THEN SIGNAL SQLSTATE '55000' SET MESSAGE_TEXT = m;
        WHEN 'P0002' THEN SIGNAL SQLSTATE 'P0002' SET MESSAGE_TEXT = m;
        ELSE SIGNAL SQLSTATE 'HY000' SET MESSAGE_TEXT = m;
    END CASE;
END $$

-- Refuses JSON text that serde_json refuses, as the CLI words it: `reason` at the
-- line and column of byte `i` (1-based; 0 before the first).
DROP PROCEDURE IF EXISTS leasehold_json_fail $$
CREATE PROCEDURE leasehold_json_fail(IN doc LONGBLOB, IN i BIGINT, IN reason VARCHAR(100))
    NO SQL SQL SECURITY INVOKER
BEGIN
    DECLARE head LONGBLOB DEFAULT LEFT(doc, i);
    DECLARE line BIGINT DEFAULT 1 + LENGTH(head) - LENGTH(REPLACE(head, X'0A', ''));
    DECLARE col BIGINT DEFAULT IF(LOCATE(X'0A', head) = 0, i, LOCATE(X'0A', REVERSE(head)) - 1);
    CALL leasehold_raise('22023', CONCAT('input: not JSON: ', reason, ' at line ', line, ' column ', col));
END $$

-- The UTF-8 bytes of code point `cp`.
DROP FUNCTION IF EXISTS leasehold_utf8 $$
CREATE FUNCTION leasehold_utf8(cp INT) RETURNS VARBINARY(4)
    DETERMINISTIC NO SQL SQL SECURITY INVOKER
RETURN CASE
    WHEN cp < 128 THEN CHAR(cp)
    WHEN cp < 2048 THEN CHAR(192 | (cp >> 6), 128 | (cp & 63))
    WHEN cp < 65536 THEN CHAR(224 | (cp >> 12), 128 | ((cp >> 6) & 63), 128 | (cp & 63))
    ELSE CHAR(240 | (cp >> 18), 128 | ((cp >> 12) & 63), 128 | ((cp >> 6) & 63), 128 | (cp & 63))
END $$

-- A JSON string literal of `raw` (UTF-8 bytes) as serde_json writes it: `"` and
-- `\` escaped, \b \f \n \r \t, other characters below U+0020 as \u00xx
-- (lowercase), everything else (`/`, U+007F, non-ASCII) as it is. (Backslashes
-- are written as X'5C', so that no sql_mode changes what a literal means.)
DROP FUNCTION IF EXISTS leasehold_json_string $$
CREATE FUNCTION leasehold_json_string(raw LONGBLOB) RETURNS LONGBLOB
    DETERMINISTIC NO SQL SQL SECURITY INVOKER
BEGIN
    DECLARE s LONGBLOB DEFAULT REPLACE(REPLACE(raw, X'5C', X'5C5C'), '"', X'5C22');
    DECLARE c INT DEFAULT 0;
    WHILE c < 32 DO
        IF LOCATE(CHAR(c), s) > 0 THEN
            SET s = REPLACE(s, CHAR(c), CASE c
                WHEN 8 THEN X'5C62' WHEN 9 THEN X'5C74' WHEN 10 THEN X'5C6E'
                WHEN 12 THEN X'5C66' WHEN 13 THEN X'5C72'
                ELSE CONCAT(X'5C', 'u00', LOWER(LPAD(HEX(c), 2, '0'))) END);
        END IF;
        SET c = c + 1;
    END WHILE;
    RETURN CONCAT('"', s, '"');
END $$

-- The text of a canonical JSON string literal (the inverse of leasehold_json_string).
DROP FUNCTION IF EXISTS leasehold_json_unquote $$
CREATE FUNCTION leasehold_json_unquote(lit LONGBLOB) RETURNS LONGBLOB
    DETERMINISTIC NO SQL SQL SECURITY INVOKER
BEGIN
    DECLARE body LONGBLOB DEFAULT SUBSTRING(lit, 2, LENGTH(lit) - 2);
    DECLARE out_ LONGBLOB DEFAULT '';
    DECLARE i BIGINT DEFAULT 1;
    DECLARE b BIGINT;
    DECLARE c VARBINARY(1);
    IF lit IS NULL THEN
        RETURN NULL;
    END IF;
    LOOP
        SET b = LOCATE(X'5C', body, i);
        IF b = 0 THEN
            RETURN CONCAT(out_, SUBSTRING(body, i));
        END IF;
        SET c = SUBSTRING(body, b + 1, 1);
        SET out_ = CONCAT(out_, SUBSTRING(body, i, b - i), CASE c
            WHEN 'b' THEN X'08' WHEN 't' THEN X'09' WHEN 'n' THEN X'0A' WHEN 'f' THEN X'0C' WHEN 'r' THEN X'0D'
            WHEN 'u' THEN leasehold_utf8(CONV(SUBSTRING(body, b + 2, 4), 16, 10))
            ELSE c END);
        SET i = b + IF(c = 'u', 6, 2);
    END LOOP;
END $$

-- Decimal digits `s` times `f` (1 to 2^31), in decimal digits: long
-- multiplication in base 10^9.
DROP FUNCTION IF EXISTS leasehold_big_mul $$
CREATE FUNCTION leasehold_big_mul(s LONGTEXT CHARACTER SET ascii, f BIGINT) RETURNS LONGTEXT CHARACTER SET ascii
    DETERMINISTIC NO SQL SQL SECURITY INVOKER
BEGIN
    DECLARE out_ LONGTEXT CHARACTER SET ascii DEFAULT '';
    DECLARE i BIGINT DEFAULT LENGTH(s);
    DECLARE carry, v BIGINT UNSIGNED DEFAULT 0;
    WHILE i > 0 DO
        SET v = CAST(SUBSTRING(s, GREATEST(i - 8, 1), i - GREATEST(i - 8, 1) + 1) AS UNSIGNED) * f + carry;
        SET out_ = CONCAT(LPAD(v MOD 1000000000, 9, '0'), out_), carry = v DIV 1000000000, i = i - 9;
    END WHILE;
    RETURN TRIM(LEADING '0' FROM CONCAT(carry, out_));
END $$

-- The double nearest to 0.d x 10^k (d: decimal digits without leading or trailing
-- zeros; the value below the overflow threshold), ties to even. The server's
-- strtod rounds correctly for up to about 30 significant digits but can miss a
-- rounding midpoint that longer text lies just beyond. So a longer d is cut to 25
-- digits, down and up: when both round to one double, so does d; otherwise d lies
-- within 1e-25 of the midpoint between those two doubles, and is compared with
-- the midpoint's exact decimal expansion.
DROP FUNCTION IF EXISTS leasehold_double $$
CREATE FUNCTION leasehold_double(d LONGBLOB, k BIGINT) RETURNS DOUBLE
    DETERMINISTIC NO SQL SQL SECURITY INVOKER
BEGIN
    DECLARE up VARCHAR(30);
    DECLARE lo, hi DOUBLE;
    DECLARE e, n BIGINT;
    DECLARE m BIGINT UNSIGNED;
    DECLARE big LONGTEXT CHARACTER SET ascii;
    DECLARE c INT;
    -- (Text plus 0e0 is the server's strtod; CAST AS DOUBLE is not in every server.)
    IF LENGTH(d) <= 25 THEN
        RETURN CONCAT('0.', d, 'e', k) + 0e0;
    END IF;
    SET up = CAST(CAST(LEFT(d, 25) AS DECIMAL(26, 0)) + 1 AS CHAR);
    SET lo = CONCAT(LEFT(d, 25), 'e', k - 25) + 0e0;
    -- Rounded up, d might pass the overflow threshold, which d itself stays below:
    -- no other midpoint is that close, so lo is its double.
    IF k = 309 AND up >= LEFT('17976931348623158079372897140530341507993413271003', LENGTH(up)) THEN
        RETURN lo;
    END IF;
    SET hi = CONCAT(up, 'e', k - 25) + 0e0;
    IF lo = hi THEN
        RETURN lo;
    END IF;
    -- lo = m x 2^e (m < 2^53); the midpoint (2m + 1) x 2^(e - 1) in decimal.
    IF lo = 0 THEN
        SET m = 0, e = -1074;
    ELSE
        SET e = FLOOR(LOG2(lo));
        IF POWER(2, e) > lo THEN
            SET e = e - 1;
        ELSEIF POWER(2, e + 1) <= lo THEN
            SET e = e + 1;
        END IF;
        SET e = GREATEST(e - 52, -1074);
        SET m = lo / POWER(2, e);
    END IF;
    SET big = 2 * m + 1, n = e - 1;
    WHILE n >= 30 DO
        SET big = leasehold_big_mul(big, 1073741824), n = n - 30;
    END WHILE;
    IF n > 0 THEN
        SET big = leasehold_big_mul(big, POWER(2, n));
    END IF;
    SET n = -(e - 1);
    WHILE n >= 13 DO
        SET big = leasehold_big_mul(big, 1220703125), n = n - 13;
    END WHILE;
    IF n > 0 THEN
        SET big = leasehold_big_mul(big, POWER(5, n));
    END IF;
    -- midpoint = 0.big x 10^(LENGTH(big) + min(e - 1, 0))
    SET n = LENGTH(big) + LEAST(e - 1, 0), big = TRIM(TRAILING '0' FROM big);
    SET c = IF(k <> n, SIGN(k - n), STRCMP(d, CAST(big AS BINARY)));
    RETURN IF(c < 0 OR (c = 0 AND m % 2 = 0), lo, hi);
END $$

-- The canonical text of a JSON number token `tok` (valid JSON syntax), as
-- engine/src/canonical.rs writes serde_json's number: an integer literal within
-- i64 or u64 as it is (`-0`: 0); else the correctly rounded double, written as
-- the integer it equals when it is integral and at most 2^53, otherwise in its
-- shortest round-trip digits d with value 0.d x 10^k: plain for -5 < k <= 16,
-- else d[0].d[1..]e+/-(k-1). NULL when the double is infinite (out of range).
DROP FUNCTION IF EXISTS leasehold_json_number $$
CREATE FUNCTION leasehold_json_number(tok LONGBLOB) RETURNS VARCHAR(40)
    DETERMINISTIC NO SQL SQL SECURITY INVOKER
BEGIN
    -- 0.d x 10^309 overflows (rounds to infinity) from this d on: halfway between
    -- the largest double and 2^1024.
    DECLARE top VARCHAR(400) DEFAULT CONCAT(
        '1797693134862315807937289714053034150799341327100378269361737789804449682927647509466490179775872070963',
        '3028641669288791094655554785194040263065748867150582068190890200070838367627385484581771153176447573027',
        '0069855571366959622842914819860834936475292719074168444365510704342711559699508093042880177904174497792');
    DECLARE neg BOOLEAN DEFAULT LEFT(tok, 1) = '-';
    DECLARE mag LONGBLOB DEFAULT IF(LEFT(tok, 1) = '-', SUBSTRING(tok, 2), tok);
    DECLARE ex, dot, k, x BIGINT;
    DECLARE mant, ip, fp, xs, d LONGBLOB;
    DECLARE f DOUBLE;
    DECLARE r VARCHAR(40);
    DECLARE out_ VARCHAR(40);
    IF LOCATE('.', mag) = 0 AND LOCATE('e', mag) = 0 AND LOCATE('E', mag) = 0 THEN
        IF NOT neg AND (LENGTH(mag) < 20 OR (LENGTH(mag) = 20 AND mag <= '18446744073709551615')) THEN
            RETURN mag;
        END IF;
        IF neg AND (LENGTH(mag) < 19 OR (LENGTH(mag) = 19 AND mag <= '9223372036854775808')) THEN
            RETURN IF(mag = '0', '0', tok);
        END IF;
    END IF;
    -- The literal's digits and decimal exponent, exactly: value = 0.d x 10^k.
    SET ex = GREATEST(LOCATE('e', mag), LOCATE('E', mag));
    SET mant = IF(ex = 0, mag, LEFT(mag, ex - 1));
    SET xs = IF(ex = 0, '', SUBSTRING(mag, ex + 1));
    SET dot = LOCATE('.', mant);
    SET ip = IF(dot = 0, mant, LEFT(mant, dot - 1));
    SET fp = IF(dot = 0, '', SUBSTRING(mant, dot + 1));
    SET d = TRIM(LEADING '0' FROM CONCAT(ip, fp));
    IF d = '' THEN
        RETURN '0';
    END IF;
    SET k = LENGTH(ip) - (LENGTH(ip) + LENGTH(fp) - LENGTH(d));
    SET d = TRIM(TRAILING '0' FROM d);
    SET x = IF(LEFT(xs, 1) = '-', -1, 1);
    SET xs = TRIM(LEADING '0' FROM IF(LEFT(xs, 1) IN ('+', '-'), SUBSTRING(xs, 2), xs));
    IF LENGTH(xs) > 15 THEN
        -- A nonzero number times 10 to a power of sixteen digits or more.
        RETURN IF(x < 0, '0', NULL);
    END IF;
    SET k = k + x * CAST(IF(xs = '', '0', xs) AS SIGNED);
    IF k > 309 OR (k = 309 AND d >= top) THEN
        RETURN NULL;
    END IF;
    IF k < -324 THEN
        RETURN '0';
    END IF;
    SET f = leasehold_double(d, k);
    IF f = 0 THEN
        RETURN '0';
    END IF;
    IF ABS(f) <= 9007199254740992 AND f = FLOOR(f) THEN
        RETURN CONCAT(IF(neg, '-', ''), CAST(CAST(ABS(f) AS UNSIGNED) AS CHAR));
    END IF;
    -- The shortest digits that read back as f (the server prints those), and
    -- where the point goes.
    SET r = CAST(ABS(f) AS CHAR);
    SET ex = LOCATE('e', r);
    SET mant = IF(ex = 0, r, LEFT(r, ex - 1));
    SET x = IF(ex = 0, 0, CAST(SUBSTRING(r, ex + 1) AS SIGNED));
    SET dot = LOCATE('.', mant);
    SET ip = IF(dot = 0, mant, LEFT(mant, dot - 1));
    SET fp = IF(dot = 0, '', SUBSTRING(mant, dot + 1));
    SET d = TRIM(LEADING '0' FROM CONCAT(ip, fp));
    SET k = LENGTH(ip) - (LENGTH(ip) + LENGTH(fp) - LENGTH(d)) + x;
    SET d = TRIM(TRAILING '0' FROM d);
    IF k > -5 AND k <= 16 THEN
        SET out_ = CASE
            WHEN k <= 0 THEN CONCAT('0.', REPEAT('0', -k), d)
            WHEN k >= LENGTH(d) THEN CONCAT(d, REPEAT('0', k - LENGTH(d)), '.0')
            ELSE CONCAT(LEFT(d, k), '.', SUBSTRING(d, k + 1)) END;
    ELSE
        SET out_ = CONCAT(LEFT(d, 1), IF(LENGTH(d) > 1, CONCAT('.', SUBSTRING(d, 2)), ''),
                          'e', IF(k - 1 < 0, '-', '+'), ABS(k - 1));
    END IF;
    RETURN CONCAT(IF(neg, '-', ''), out_);
END $$

-- The JSON parser: reads `doc` as serde_json does (the same refusals, worded as
-- serde_json words them, with its line and column) and answers, by `want`:
--   'c': the canonical JSON of the value;
--   'm': the value's listing: `:<canonical hex>:<type>;` and then, for an object,
--        `<key hex>:<value's canonical hex>:<type>;` per member in canonical
--        order, each type as serde_json reads the value (`integer` only for an
--        integer literal within i64 or u64, so 2.0 and -0 are numbers);
--   'p': the path of the value that starts at byte `at_pos` of canonical `doc`,
--        from `base` (`base.key[3]`): how a refusal names where a reference stands.
-- Containers are held on an explicit stack (stored functions cannot recurse).
-- `vals` holds the canonical text of each open container's finished members, one
-- container after the other (an object's member as `"key":value`), keytext the
-- text of each open object's keys. `idx` holds per open object one 51-byte
-- record per member, kept sorted by key bytes (binary search; an equal key
-- replaces the record: the last of equal keys wins, as in serde_json): the
-- key's start and length in keytext, the member's start, its value's start and
-- its end in `vals` (10 digits each), and the value's type code. The innermost
-- container is in fk..fr, the ones around it in `frames`, 67 bytes each.
DROP FUNCTION IF EXISTS leasehold_json_scan $$
CREATE FUNCTION leasehold_json_scan(doc LONGBLOB, want CHAR(1), base LONGBLOB, at_pos BIGINT) RETURNS LONGBLOB
    DETERMINISTIC NO SQL SQL SECURITY INVOKER
BEGIN
    DECLARE n BIGINT DEFAULT LENGTH(doc);
    DECLARE p BIGINT DEFAULT 1;
    DECLARE st CHAR(1) DEFAULT 'v';
    DECLARE c VARBINARY(1);
    -- The value that ended, and its type: s(tring) i(nteger) n(umber) b(oolean)
    -- z (null) o(bject) a(rray).
    DECLARE v LONGBLOB;
    DECLARE t CHAR(1);
    DECLARE listing LONGBLOB DEFAULT '';
    DECLARE is_key BOOLEAN DEFAULT FALSE;
    DECLARE depth INT DEFAULT 0;
    DECLARE frames VARBINARY(9000) DEFAULT '';
    -- The innermost container: its kind ('[' or '{'), where its parts of vals, idx
    -- and keytext start, the length of its path, its member count, and the
    -- record of the member whose value is being read.
    DECLARE fk VARBINARY(1);
    DECLARE fv, fi, fks, fp, fc, fr BIGINT;
    DECLARE vals, idx, keytext LONGBLOB DEFAULT '';
    DECLARE path LONGBLOB DEFAULT COALESCE(base, '');
    DECLARE s, e, cc, i, lo, hi, mid BIGINT;
    DECLARE nq, nb, nt, nn, nr BIGINT DEFAULT 0;
    DECLARE first_ctl BIGINT DEFAULT n + 1;
    DECLARE raw, canon, tok, lit, other LONGBLOB;
    DECLARE rec VARBINARY(51);
    DECLARE hx VARBINARY(4);
    DECLARE cp, cp2 INT;
    DECLARE found BOOLEAN;

    -- A control byte other than TAB, LF and CR is refused wherever it stands; the
    -- first one is found once.
    SET i = 0;
    WHILE i < 32 DO
        IF i NOT IN (9, 10, 13) THEN
            SET cc = LOCATE(CHAR(i), doc);
            IF cc > 0 AND cc < first_ctl THEN
                SET first_ctl = cc;
            END IF;
        END IF;
        SET i = i + 1;
    END WHILE;

    scan: LOOP
        IF st = 'v' THEN
            -- A value is due at p.
            SET c = SUBSTRING(doc, p, 1);
            WHILE c IN (' ', X'09', X'0A', X'0D') DO
                SET p = p + 1, c = SUBSTRING(doc, p, 1);
            END WHILE;
            IF p > n THEN
                CALL leasehold_json_fail(doc, n, 'EOF while parsing a value');
            END IF;
            IF want = 'p' AND p = at_pos THEN
                RETURN path;
            END IF;
            IF c = '"' THEN
                SET is_key = FALSE, st = 's';
            ELSEIF c = '{' OR c = '[' THEN
                IF depth >= 127 THEN
                    CALL leasehold_json_fail(doc, p, 'recursion limit exceeded');
                END IF;
                IF depth > 0 THEN
                    SET frames = CONCAT(frames, fk, LPAD(fv, 11, '0'), LPAD(fi, 11, '0'), LPAD(fks, 11, '0'),
                                        LPAD(fp, 11, '0'), LPAD(fc, 11, '0'), LPAD(fr, 11, '0'));
                END IF;
                SET depth = depth + 1, fk = c, fv = LENGTH(vals) + 1, fi = LENGTH(idx) + 1, fks = LENGTH(keytext) + 1,
                    fp = LENGTH(path), fc = 0, fr = 0;
                SET p = p + 1, c = SUBSTRING(doc, p, 1);
                WHILE c IN (' ', X'09', X'0A', X'0D') DO
                    SET p = p + 1, c = SUBSTRING(doc, p, 1);
                END WHILE;
                IF fk = '[' THEN
                    IF p > n THEN
                        CALL leasehold_json_fail(doc, n, 'EOF while parsing a list');
                    END IF;
                    IF c = ']' THEN
                        SET p = p + 1, st = 'c';
                    ELSE
                        IF want = 'p' THEN
                            SET path = CONCAT(path, '[0]');
                        END IF;
                        SET st = 'v';
                    END IF;
                ELSE
                    IF p > n THEN
                        CALL leasehold_json_fail(doc, n, 'EOF while parsing an object');
                    END IF;
                    IF c = '}' THEN
                        SET p = p + 1, st = 'c';
                    ELSEIF c = '"' THEN
                        SET is_key = TRUE, st = 's';
                    ELSE
                        CALL leasehold_json_fail(doc, p, 'key must be a string');
                    END IF;
                END IF;
            ELSEIF c IN ('t', 'f', 'n') THEN
                SET lit = CASE c WHEN 't' THEN 'true' WHEN 'f' THEN 'false' ELSE 'null' END;
                SET i = 2, p = p + 1;
                WHILE i <= LENGTH(lit) DO
                    IF p > n THEN
                        CALL leasehold_json_fail(doc, n, 'EOF while parsing a value');
                    END IF;
                    IF SUBSTRING(doc, p, 1) <> SUBSTRING(lit, i, 1) THEN
                        CALL leasehold_json_fail(doc, p, 'expected ident');
                    END IF;
                    SET p = p + 1, i = i + 1;
                END WHILE;
                SET v = lit, t = IF(c = 'n', 'z', 'b'), st = 'a';
            ELSEIF c = '-' OR c BETWEEN '0' AND '9' THEN
                -- A number: its syntax as serde_json checks it, then its value.
                SET s = p;
                IF c = '-' THEN
                    SET p = p + 1;
                    IF p > n THEN
                        CALL leasehold_json_fail(doc, n, 'EOF while parsing a value');
                    END IF;
                    SET c = SUBSTRING(doc, p, 1);
                END IF;
                IF c = '0' THEN
                    SET p = p + 1;
                    IF SUBSTRING(doc, p, 1) BETWEEN '0' AND '9' THEN
                        CALL leasehold_json_fail(doc, p, 'invalid number');
                    END IF;
                ELSEIF c BETWEEN '1' AND '9' THEN
                    SET p = p + 1;
                    WHILE SUBSTRING(doc, p, 1) BETWEEN '0' AND '9' DO
                        SET p = p + 1;
                    END WHILE;
                ELSE
                    CALL leasehold_json_fail(doc, p, 'invalid number');
                END IF;
                IF SUBSTRING(doc, p, 1) = '.' THEN
                    SET p = p + 1;
                    IF NOT SUBSTRING(doc, p, 1) BETWEEN '0' AND '9' THEN
                        IF p > n THEN
                            CALL leasehold_json_fail(doc, n, 'EOF while parsing a value');
                        END IF;
                        CALL leasehold_json_fail(doc, p, 'invalid number');
                    END IF;
                    WHILE SUBSTRING(doc, p, 1) BETWEEN '0' AND '9' DO
                        SET p = p + 1;
                    END WHILE;
                END IF;
                IF SUBSTRING(doc, p, 1) IN ('e', 'E') THEN
                    SET p = p + 1;
                    IF SUBSTRING(doc, p, 1) IN ('+', '-') THEN
                        SET p = p + 1;
                    END IF;
                    IF p > n THEN
                        CALL leasehold_json_fail(doc, n, 'EOF while parsing a value');
                    END IF;
                    IF NOT SUBSTRING(doc, p, 1) BETWEEN '0' AND '9' THEN
                        CALL leasehold_json_fail(doc, p, 'invalid number');
                    END IF;
                    WHILE SUBSTRING(doc, p, 1) BETWEEN '0' AND '9' DO
                        SET p = p + 1;
                    END WHILE;
                END IF;
                SET tok = SUBSTRING(doc, s, p - s);
                IF p - s <= 18 AND LOCATE('.', tok) = 0 AND LOCATE('e', tok) = 0 AND LOCATE('E', tok) = 0 THEN
                    -- serde_json reads -0 as a float.
                    SET v = IF(tok = '-0', '0', tok), t = IF(tok = '-0', 'n', 'i');
                ELSE
                    SET v = leasehold_json_number(tok);
                    IF v IS NULL THEN
                        -- Out of range: where serde_json stops, at the end of the
                        -- number or at the digit its exponent overflows an i32.
                        SET e = GREATEST(LOCATE('e', tok), LOCATE('E', tok));
                        SET e = e + IF(e > 0 AND SUBSTRING(tok, e + 1, 1) IN ('+', '-'), 1, 0);
                        SET lit = IF(e = 0, '', SUBSTRING(tok, e + 1));
                        SET i = LENGTH(lit) - LENGTH(TRIM(LEADING '0' FROM lit));
                        SET lit = TRIM(LEADING '0' FROM lit);
                        IF LENGTH(lit) > 10 OR (LENGTH(lit) = 10 AND lit > '2147483647') THEN
                            SET i = s - 1 + e + i + IF(LEFT(lit, 10) > '2147483647', 10, 11);
                        ELSE
                            SET i = p - 1;
                        END IF;
                        CALL leasehold_json_fail(doc, i, 'number out of range');
                    END IF;
                    SET t = IF(LOCATE('.', tok) = 0 AND LOCATE('e', tok) = 0 AND LOCATE('E', tok) = 0 AND v = tok, 'i', 'n');
                END IF;
                SET st = 'a';
            ELSE
                CALL leasehold_json_fail(doc, p, 'expected value');
            END IF;

        ELSEIF st = 's' THEN
            -- A string starts at p: its text (raw) and its canonical literal. The
            -- next quote, backslash, TAB, LF and CR are looked up once each and
            -- kept until passed.
            SET s = p + 1, raw = '', canon = '"';
            str: LOOP
                IF nq < s THEN SET nq = LOCATE('"', doc, s); IF nq = 0 THEN SET nq = n + 1; END IF; END IF;
                IF nb < s THEN SET nb = LOCATE(X'5C', doc, s); IF nb = 0 THEN SET nb = n + 1; END IF; END IF;
                IF nt < s THEN SET nt = LOCATE(X'09', doc, s); IF nt = 0 THEN SET nt = n + 1; END IF; END IF;
                IF nn < s THEN SET nn = LOCATE(X'0A', doc, s); IF nn = 0 THEN SET nn = n + 1; END IF; END IF;
                IF nr < s THEN SET nr = LOCATE(X'0D', doc, s); IF nr = 0 THEN SET nr = n + 1; END IF; END IF;
                SET e = LEAST(nq, nb), cc = LEAST(nt, nn, nr, first_ctl);
                IF cc < e THEN
                    CALL leasehold_json_fail(doc, cc, CONCAT('control character (', X'5C', 'u0000-', X'5C',
                                                             'u001F) found while parsing a string'));
                END IF;
                IF e > n THEN
                    CALL leasehold_json_fail(doc, n, 'EOF while parsing a string');
                END IF;
                SET raw = CONCAT(raw, SUBSTRING(doc, s, e - s)), canon = CONCAT(canon, SUBSTRING(doc, s, e - s));
                IF e = nq THEN
                    SET p = e + 1, canon = CONCAT(canon, '"');
                    LEAVE str;
                END IF;
                -- An escape.
                IF e + 1 > n THEN
                    CALL leasehold_json_fail(doc, n, 'EOF while parsing a string');
                END IF;
                SET c = SUBSTRING(doc, e + 1, 1), s = e + 2;
                IF c = 'u' THEN
                    IF e + 5 > n THEN
                        CALL leasehold_json_fail(doc, n, 'EOF while parsing a string');
                    END IF;
                    SET hx = SUBSTRING(doc, e + 2, 4);
                    IF LPAD(CONV(hx, 16, 16), 4, '0') <> UPPER(CONVERT(hx USING ascii)) THEN
                        CALL leasehold_json_fail(doc, e + 5, 'invalid escape');
                    END IF;
                    SET cp = CONV(hx, 16, 10), s = e + 6;
                    IF cp BETWEEN 56320 AND 57343 THEN
                        CALL leasehold_json_fail(doc, e + 5, 'lone leading surrogate in hex escape');
                    END IF;
                    IF cp BETWEEN 55296 AND 56319 THEN
                        -- A leading surrogate: a trailing one must follow.
                        IF e + 6 > n THEN
                            CALL leasehold_json_fail(doc, n, 'EOF while parsing a string');
                        END IF;
                        IF SUBSTRING(doc, e + 6, 1) <> X'5C' THEN
                            CALL leasehold_json_fail(doc, e + 6, 'unexpected end of hex escape');
                        END IF;
                        IF e + 7 > n THEN
                            CALL leasehold_json_fail(doc, n, 'EOF while parsing a string');
                        END IF;
                        IF SUBSTRING(doc, e + 7, 1) <> 'u' THEN
                            CALL leasehold_json_fail(doc, e + 7, 'unexpected end of hex escape');
                        END IF;
                        IF e + 11 > n THEN
                            CALL leasehold_json_fail(doc, n, 'EOF while parsing a string');
                        END IF;
                        SET hx = SUBSTRING(doc, e + 8, 4);
                        IF LPAD(CONV(hx, 16, 16), 4, '0') <> UPPER(CONVERT(hx USING ascii)) THEN
                            CALL leasehold_json_fail(doc, e + 11, 'invalid escape');
                        END IF;
                        SET cp2 = CONV(hx, 16, 10), s = e + 12;
                        IF NOT cp2 BETWEEN 56320 AND 57343 THEN
                            CALL leasehold_json_fail(doc, e + 11, 'lone leading surrogate in hex escape');
                        END IF;
                        SET cp = 65536 + ((cp - 55296) << 10) + (cp2 - 56320);
                    END IF;
                    SET raw = CONCAT(raw, leasehold_utf8(cp));
                    SET canon = CONCAT(canon, CASE
                        WHEN cp = 8 THEN X'5C62' WHEN cp = 9 THEN X'5C74' WHEN cp = 10 THEN X'5C6E'
                        WHEN cp = 12 THEN X'5C66' WHEN cp = 13 THEN X'5C72'
                        WHEN cp < 32 THEN CONCAT(X'5C', 'u00', LOWER(LPAD(HEX(cp), 2, '0')))
                        WHEN cp = 34 THEN X'5C22' WHEN cp = 92 THEN X'5C5C'
                        ELSE leasehold_utf8(cp) END);
                ELSEIF c = '"' THEN SET raw = CONCAT(raw, '"'), canon = CONCAT(canon, X'5C22');
                ELSEIF c = X'5C' THEN SET raw = CONCAT(raw, X'5C'), canon = CONCAT(canon, X'5C5C');
                ELSEIF c = '/' THEN SET raw = CONCAT(raw, '/'), canon = CONCAT(canon, '/');
                ELSEIF c = 'b' THEN SET raw = CONCAT(raw, X'08'), canon = CONCAT(canon, X'5C62');
                ELSEIF c = 'f' THEN SET raw = CONCAT(raw, X'0C'), canon = CONCAT(canon, X'5C66');
                ELSEIF c = 'n' THEN SET raw = CONCAT(raw, X'0A'), canon = CONCAT(canon, X'5C6E');
                ELSEIF c = 'r' THEN SET raw = CONCAT(raw, X'0D'), canon = CONCAT(canon, X'5C72');
                ELSEIF c = 't' THEN SET raw = CONCAT(raw, X'09'), canon = CONCAT(canon, X'5C74');
                ELSE
                    CALL leasehold_json_fail(doc, e + 1, 'invalid escape');
                END IF;
            END LOOP str;
            IF NOT is_key THEN
                SET v = canon, t = 's', st = 'a';
            ELSE
                -- A member's key: the member's text starts with it, and its record
                -- goes where the key sorts among the object's records (over the
                -- record of an equal key).
                SET lo = 0, hi = (LENGTH(idx) - fi + 1) DIV 51, found = FALSE;
                WHILE lo < hi AND NOT found DO
                    SET mid = (lo + hi) DIV 2, i = fi + 51 * mid;
                    SET other = SUBSTRING(keytext, SUBSTRING(idx, i, 10), SUBSTRING(idx, i + 10, 10));
                    IF other = raw THEN
                        SET lo = mid, found = TRUE;
                    ELSEIF other < raw THEN
                        SET lo = mid + 1;
                    ELSE
                        SET hi = mid;
                    END IF;
                END WHILE;
                SET fr = fi + 51 * lo;
                SET rec = CONCAT(LPAD(LENGTH(keytext) + 1, 10, '0'), LPAD(LENGTH(raw), 10, '0'), LPAD(LENGTH(vals) + 1, 10, '0'),
                                 LPAD(LENGTH(vals) + LENGTH(canon) + 2, 10, '0'), '0000000000', ' ');
                SET idx = CONCAT(LEFT(idx, fr - 1), rec, SUBSTRING(idx, fr + IF(found, 51, 0)));
                SET keytext = CONCAT(keytext, raw), vals = CONCAT(vals, canon, ':');
                IF want = 'p' THEN
                    SET path = CONCAT(LEFT(path, fp), '.', raw);
                END IF;
                SET c = SUBSTRING(doc, p, 1);
                WHILE c IN (' ', X'09', X'0A', X'0D') DO
                    SET p = p + 1, c = SUBSTRING(doc, p, 1);
                END WHILE;
                IF p > n THEN
                    CALL leasehold_json_fail(doc, n, 'EOF while parsing an object');
                END IF;
                IF c <> ':' THEN
                    CALL leasehold_json_fail(doc, p, 'expected `:`');
                END IF;
                SET p = p + 1, st = 'v';
            END IF;

        ELSEIF st = 'a' THEN
            -- Value v (of type t) ended: it joins its container; then what follows it.
            SET c = SUBSTRING(doc, p, 1);
            WHILE c IN (' ', X'09', X'0A', X'0D') DO
                SET p = p + 1, c = SUBSTRING(doc, p, 1);
            END WHILE;
            IF depth = 0 THEN
                IF p <= n THEN
                    CALL leasehold_json_fail(doc, p, 'trailing characters');
                END IF;
                IF want = 'm' THEN
                    RETURN CONCAT(':', HEX(v), ':', ELT(FIELD(t, 's', 'i', 'n', 'b', 'z', 'o', 'a'),
                                  'string', 'integer', 'number', 'boolean', 'null', 'object', 'array'), ';', listing);
                END IF;
                RETURN IF(want = 'c', v, NULL);
            END IF;
            IF fk = '[' THEN
                SET vals = CONCAT(vals, v, ','), fc = fc + 1;
                IF p > n THEN
                    CALL leasehold_json_fail(doc, n, 'EOF while parsing a list');
                END IF;
                IF c = ']' THEN
                    SET p = p + 1, st = 'c';
                ELSEIF c = ',' THEN
                    SET p = p + 1, c = SUBSTRING(doc, p, 1);
                    WHILE c IN (' ', X'09', X'0A', X'0D') DO
                        SET p = p + 1, c = SUBSTRING(doc, p, 1);
                    END WHILE;
                    IF p > n THEN
                        CALL leasehold_json_fail(doc, n, 'EOF while parsing a value');
                    END IF;
                    IF c = ']' THEN
                        CALL leasehold_json_fail(doc, p, 'trailing comma');
                    END IF;
                    IF want = 'p' THEN
                        SET path = CONCAT(LEFT(path, fp), '[', fc, ']');
                    END IF;
                    SET st = 'v';
                ELSE
                    CALL leasehold_json_fail(doc, p, 'expected `,` or `]`');
                END IF;
            ELSE
                -- The member's record gets its end and its type.
                SET vals = CONCAT(vals, v), fc = fc + 1;
                SET idx = CONCAT(LEFT(idx, fr + 39), LPAD(LENGTH(vals), 10, '0'), t, SUBSTRING(idx, fr + 51));
                IF p > n THEN
                    CALL leasehold_json_fail(doc, n, 'EOF while parsing an object');
                END IF;
                IF c = '}' THEN
                    SET p = p + 1, st = 'c';
                ELSEIF c = ',' THEN
                    SET p = p + 1, c = SUBSTRING(doc, p, 1);
                    WHILE c IN (' ', X'09', X'0A', X'0D') DO
                        SET p = p + 1, c = SUBSTRING(doc, p, 1);
                    END WHILE;
                    IF p > n THEN
                        CALL leasehold_json_fail(doc, n, 'EOF while parsing a value');
                    END IF;
                    IF c = '"' THEN
                        SET is_key = TRUE, st = 's';
                    ELSEIF c = '}' THEN
                        CALL leasehold_json_fail(doc, p, 'trailing comma');
                    ELSE
                        CALL leasehold_json_fail(doc, p, 'key must be a string');
                    END IF;
                ELSE
                    CALL leasehold_json_fail(doc, p, 'expected `,` or `}`');
                END IF;
            END IF;

        ELSE
            -- st = 'c': the innermost container ended; its canonical text becomes v.
            IF fk = '[' THEN
                SET v = IF(LENGTH(vals) < fv, '[]', CONCAT('[', SUBSTRING(vals, fv, LENGTH(vals) - fv), ']')), t = 'a';
            ELSE
                -- The members in record order; the outermost object's listing.
                SET v = '', i = fi;
                WHILE i < LENGTH(idx) DO
                    SET s = SUBSTRING(idx, i + 20, 10), e = SUBSTRING(idx, i + 40, 10);
                    SET v = CONCAT(v, IF(i = fi, '', ','), SUBSTRING(vals, s, e - s + 1));
                    IF want = 'm' AND depth = 1 THEN
                        SET s = SUBSTRING(idx, i + 30, 10);
                        SET listing = CONCAT(listing, HEX(SUBSTRING(keytext, SUBSTRING(idx, i, 10), SUBSTRING(idx, i + 10, 10))),
                            ':', HEX(SUBSTRING(vals, s, e - s + 1)), ':',
                            ELT(FIELD(SUBSTRING(idx, i + 50, 1), 's', 'i', 'n', 'b', 'z', 'o', 'a'),
                                'string', 'integer', 'number', 'boolean', 'null', 'object', 'array'), ';');
                    END IF;
                    SET i = i + 51;
                END WHILE;
                SET v = CONCAT('{', v, '}'), t = 'o', idx = LEFT(idx, fi - 1), keytext = LEFT(keytext, fks - 1);
            END IF;
            SET vals = LEFT(vals, fv - 1);
            IF want = 'p' THEN
                SET path = LEFT(path, fp);
            END IF;
            SET depth = depth - 1, st = 'a';
            IF depth > 0 THEN
                SET i = LENGTH(frames) - 66;
                SET fk = SUBSTRING(frames, i, 1), fv = SUBSTRING(frames, i + 1, 11), fi = SUBSTRING(frames, i + 12, 11),
                    fks = SUBSTRING(frames, i + 23, 11), fp = SUBSTRING(frames, i + 34, 11),
                    fc = SUBSTRING(frames, i + 45, 11), fr = SUBSTRING(frames, i + 56, 11);
                SET frames = LEFT(frames, i - 1);
            END IF;
        END IF;
    END LOOP scan;
END $$

-- The canonical JSON of `doc` (engine/src/canonical.rs): no whitespace, object
-- keys sorted by their UTF-8 bytes (the last of duplicate keys wins), numbers as
-- leasehold_json_number writes them, strings as leasehold_json_string does.
DROP FUNCTION IF EXISTS leasehold_canonical_json $$
CREATE FUNCTION leasehold_canonical_json(doc LONGBLOB) RETURNS LONGBLOB
    DETERMINISTIC NO SQL SQL SECURITY INVOKER
RETURN leasehold_json_scan(doc, 'c', NULL, NULL) $$

-- Where the string literal that starts at byte `pos` of JSON text `doc` ends (the
-- byte after its closing quote: the first quote after an even number of backslashes).
DROP FUNCTION IF EXISTS leasehold_json_string_end $$
CREATE FUNCTION leasehold_json_string_end(doc LONGBLOB, pos BIGINT) RETURNS BIGINT
    DETERMINISTIC NO SQL SQL SECURITY INVOKER
BEGIN
    DECLARE i BIGINT DEFAULT pos + 1;
    DECLARE q, k BIGINT;
    LOOP
        SET q = LOCATE('"', doc, i), k = 0;
        IF q = 0 THEN
            RETURN LENGTH(doc) + 1;
        END IF;
        WHILE SUBSTRING(doc, q - k - 1, 1) = X'5C' DO
            SET k = k + 1;
        END WHILE;
        IF k % 2 = 0 THEN
            RETURN q + 1;
        END IF;
        SET i = q + 1;
    END LOOP;
END $$

-- Where the value that starts at byte `pos` of canonical JSON `doc` ends (the
-- byte after it). Inside a container, the next quote and bracket of each kind are
-- looked up once each and kept until passed.
DROP FUNCTION IF EXISTS leasehold_json_end $$
CREATE FUNCTION leasehold_json_end(doc LONGBLOB, pos BIGINT) RETURNS BIGINT
    DETERMINISTIC NO SQL SQL SECURITY INVOKER
BEGIN
    DECLARE n BIGINT DEFAULT LENGTH(doc);
    DECLARE c VARBINARY(1) DEFAULT SUBSTRING(doc, pos, 1);
    DECLARE i BIGINT DEFAULT pos + 1;
    DECLARE depth INT DEFAULT 1;
    DECLARE m BIGINT;
    DECLARE nq, no, na, nc, nz BIGINT DEFAULT 0;
    IF c = '"' THEN
        RETURN leasehold_json_string_end(doc, pos);
    END IF;
    IF c = '{' OR c = '[' THEN
        LOOP
            IF nq < i THEN SET nq = LOCATE('"', doc, i); IF nq = 0 THEN SET nq = n + 1; END IF; END IF;
            IF no < i THEN SET no = LOCATE('{', doc, i); IF no = 0 THEN SET no = n + 1; END IF; END IF;
            IF na < i THEN SET na = LOCATE('[', doc, i); IF na = 0 THEN SET na = n + 1; END IF; END IF;
            IF nc < i THEN SET nc = LOCATE('}', doc, i); IF nc = 0 THEN SET nc = n + 1; END IF; END IF;
            IF nz < i THEN SET nz = LOCATE(']', doc, i); IF nz = 0 THEN SET nz = n + 1; END IF; END IF;
            SET m = LEAST(nq, no, na, nc, nz);
            IF m > n THEN
                RETURN n + 1;
            ELSEIF m = nq THEN
                SET i = leasehold_json_string_end(doc, m);
            ELSEIF m = no OR m = na THEN
                SET depth = depth + 1, i = m + 1;
            ELSE
                SET depth = depth - 1, i = m + 1;
                IF depth = 0 THEN
                    RETURN i;
                END IF;
            END IF;
        END LOOP;
    END IF;
    -- A number or a literal.
    WHILE i <= n AND SUBSTRING(doc, i, 1) NOT IN (',', ']', '}') DO
        SET i = i + 1;
    END WHILE;
    RETURN i;
END $$

-- Where the value of member `k` (text) of the canonical JSON object at byte `pos`
-- of `doc` starts, or 0. Only the members before it are walked over.
DROP FUNCTION IF EXISTS leasehold_json_member $$
CREATE FUNCTION leasehold_json_member(doc LONGBLOB, pos BIGINT, k LONGBLOB) RETURNS BIGINT
    DETERMINISTIC NO SQL SQL SECURITY INVOKER
BEGIN
    DECLARE lit LONGBLOB DEFAULT leasehold_json_string(k);
    DECLARE i BIGINT DEFAULT pos + 1;
    DECLARE ke BIGINT;
    IF SUBSTRING(doc, pos, 1) <> '{' OR SUBSTRING(doc, i, 1) = '}' THEN
        RETURN 0;
    END IF;
    LOOP
        SET ke = leasehold_json_string_end(doc, i);
        IF ke - i = LENGTH(lit) AND SUBSTRING(doc, i, ke - i) = lit THEN
            RETURN ke + 1;
        END IF;
        SET i = leasehold_json_end(doc, ke + 1);
        IF SUBSTRING(doc, i, 1) <> ',' THEN
            RETURN 0;
        END IF;
        SET i = i + 1;
    END LOOP;
END $$

-- The value of member `k` of canonical JSON object `doc`, or NULL.
DROP FUNCTION IF EXISTS leasehold_json_get $$
CREATE FUNCTION leasehold_json_get(doc LONGBLOB, k LONGBLOB) RETURNS LONGBLOB
    DETERMINISTIC NO SQL SQL SECURITY INVOKER
BEGIN
    DECLARE i BIGINT DEFAULT leasehold_json_member(doc, 1, k);
    RETURN IF(i = 0, NULL, SUBSTRING(doc, i, leasehold_json_end(doc, i) - i));
END $$

-- What JSON pointer `ptr` (RFC 6901, as serde_json's Value::pointer reads it:
-- `~1` is `/`, `~0` is `~`, an array index is 0 or has no leading zero) names in
-- canonical JSON `doc`, or NULL. It walks `doc` in place, to the value's start.
DROP FUNCTION IF EXISTS leasehold_json_pointer $$
CREATE FUNCTION leasehold_json_pointer(doc LONGBLOB, ptr LONGBLOB) RETURNS LONGBLOB
    DETERMINISTIC NO SQL SQL SECURITY INVOKER
BEGIN
    DECLARE pos BIGINT DEFAULT 1;
    DECLARE rest, tok LONGBLOB;
    DECLARE slash, i, e, j, k BIGINT;
    IF ptr = '' THEN
        RETURN doc;
    END IF;
    IF LEFT(ptr, 1) <> '/' THEN
        RETURN NULL;
    END IF;
    SET rest = SUBSTRING(ptr, 2);
    LOOP
        SET slash = LOCATE('/', rest);
        SET tok = REPLACE(REPLACE(IF(slash = 0, rest, LEFT(rest, slash - 1)), '~1', '/'), '~0', '~');
        IF SUBSTRING(doc, pos, 1) = '{' THEN
            SET pos = leasehold_json_member(doc, pos, tok);
            IF pos = 0 THEN
                RETURN NULL;
            END IF;
        ELSEIF SUBSTRING(doc, pos, 1) = '[' THEN
            IF LENGTH(tok) > 18 OR NOT CONVERT(tok USING utf8mb4) REGEXP '^(0|[1-9][0-9]*)$'
               OR SUBSTRING(doc, pos + 1, 1) = ']' THEN
                RETURN NULL;
            END IF;
            SET k = CAST(tok AS UNSIGNED), i = pos + 1, j = 0;
            WHILE j < k DO
                SET e = leasehold_json_end(doc, i);
                IF SUBSTRING(doc, e, 1) <> ',' THEN
                    RETURN NULL;
                END IF;
                SET i = e + 1, j = j + 1;
            END WHILE;
            SET pos = i;
        ELSE
            RETURN NULL;
        END IF;
        IF slash = 0 THEN
            RETURN SUBSTRING(doc, pos, leasehold_json_end(doc, pos) - pos);
        END IF;
        SET rest = SUBSTRING(rest, slash + 1);
    END LOOP;
END $$

-- Why a character may not stand in a key (engine/src/names.rs, Unicode 18 general
-- categories): 'control' (Cc), 'invisible' (Cf, Zs but the plain space, Zl, Zp,
-- and the characters that draw nothing or a blank), or NULL.
DROP FUNCTION IF EXISTS leasehold_forbidden_char $$
CREATE FUNCTION leasehold_forbidden_char(cp INT) RETURNS VARCHAR(9)
    DETERMINISTIC NO SQL SQL SECURITY INVOKER
RETURN CASE
    WHEN cp BETWEEN 32 AND 126 THEN NULL
    -- C0, DEL, C1
    WHEN cp < 32 OR cp BETWEEN 127 AND 159 THEN 'control'
    -- U+00A0 U+00AD U+034F U+061C U+06DD U+070F U+08E2 U+1680 U+2800 U+3000
    -- U+3164 U+FEFF U+FFA0 U+110BD U+110CD U+E0001
    WHEN cp IN (160, 173, 847, 1564, 1757, 1807, 2274, 5760, 10240, 12288, 12644, 65279, 65440, 69821, 69837, 917505)
    -- U+0600-0605 U+0890-0891 U+115F-1160 U+180B-180F U+2000-200F U+2028-202F
    -- U+205F-2064 U+2066-206F U+FE00-FE0F U+FFF9-FFFB U+13430-1343F U+1BCA0-1BCA3
    -- U+1D173-1D17A U+E0020-E007F U+E0100-E01EF
      OR cp BETWEEN 1536 AND 1541 OR cp BETWEEN 2192 AND 2193 OR cp BETWEEN 4447 AND 4448
      OR cp BETWEEN 6155 AND 6159 OR cp BETWEEN 8192 AND 8207 OR cp BETWEEN 8232 AND 8239
      OR cp BETWEEN 8287 AND 8292 OR cp BETWEEN 8294 AND 8303 OR cp BETWEEN 65024 AND 65039
      OR cp BETWEEN 65529 AND 65531 OR cp BETWEEN 78896 AND 78911 OR cp BETWEEN 113824 AND 113827
      OR cp BETWEEN 119155 AND 119162 OR cp BETWEEN 917536 AND 917631 OR cp BETWEEN 917760 AND 917999
      THEN 'invisible'
    ELSE NULL
END $$

-- Refuses an enqueue key or an order key (`field` names it) as
-- transition::check_enqueue_key does: 1 to 255 characters, none that a name may
-- not hold. A control character is shown as Rust's escape_default shows it.
DROP PROCEDURE IF EXISTS leasehold_check_key $$
CREATE PROCEDURE leasehold_check_key(IN field VARCHAR(32), IN k LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin)
    NO SQL SQL SECURITY INVOKER
BEGIN
    DECLARE n BIGINT DEFAULT CHAR_LENGTH(k);
    DECLARE u LONGTEXT CHARACTER SET ascii DEFAULT HEX(CONVERT(k USING utf32));
    DECLARE i BIGINT DEFAULT 1;
    DECLARE cp INT;
    DECLARE why VARCHAR(9);
    IF n = 0 OR n > 255 THEN
        CALL leasehold_raise('22023', CONCAT(field, ': ', n, ' characters; a key has 1 to 255'));
    END IF;
    WHILE i <= n DO
        SET cp = CONV(SUBSTRING(u, 8 * i - 7, 8), 16, 10), why = leasehold_forbidden_char(cp);
        IF why = 'control' THEN
            CALL leasehold_raise('22023', CONCAT(field, ': must not contain control characters (found ', CASE cp
                WHEN 9 THEN X'5C74' WHEN 10 THEN X'5C6E' WHEN 13 THEN X'5C72'
                ELSE CONCAT(X'5C', 'u{', LOWER(HEX(cp)), '}') END, ')'));
        END IF;
        IF why = 'invisible' THEN
            CALL leasehold_raise('22023', CONCAT(field, ': must not contain invisible or separator characters (found U+',
                                                 IF(cp > 65535, HEX(cp), LPAD(HEX(cp), 4, '0')), ')'));
        END IF;
        SET i = i + 1;
    END WHILE;
END $$

-- `s` as Rust's Debug shows a string (`{:?}`): quoted, with `"` `\` escaped and
-- control characters as \0 \t \n \r or \u{..}.
DROP FUNCTION IF EXISTS leasehold_rust_debug $$
CREATE FUNCTION leasehold_rust_debug(s LONGBLOB) RETURNS LONGBLOB
    DETERMINISTIC NO SQL SQL SECURITY INVOKER
BEGIN
    DECLARE r LONGBLOB DEFAULT REPLACE(REPLACE(s, X'5C', X'5C5C'), '"', X'5C22');
    DECLARE c INT DEFAULT 0;
    WHILE c < 160 DO
        IF c < 32 OR c >= 127 THEN
            IF LOCATE(leasehold_utf8(c), r) > 0 THEN
                SET r = REPLACE(r, leasehold_utf8(c), CASE c
                    WHEN 0 THEN X'5C30' WHEN 9 THEN X'5C74' WHEN 10 THEN X'5C6E' WHEN 13 THEN X'5C72'
                    ELSE CONCAT(X'5C', 'u{', LOWER(HEX(c)), '}') END);
            END IF;
        END IF;
        SET c = c + 1;
    END WHILE;
    RETURN CONCAT('"', r, '"');
END $$

-- Checks a template's input (JSON text) against its `[input]` table (canonical
-- JSON) as engine/src/input.rs check_input does, and answers its canonical JSON.
-- The refusals name the field: the input is an object, at most 64 KiB as
-- canonical JSON; each member, in key order, a declared field, of its type (an
-- `integer` is an integer literal within i64 or u64, as serde_json reads it),
-- within its max_bytes; then the first required field (in name order) it lacks.
-- Members are read from the listings leasehold_json_scan makes (`key hex:value
-- hex:type;` each, after the whole value's entry).
DROP PROCEDURE IF EXISTS leasehold_check_input $$
CREATE PROCEDURE leasehold_check_input(IN fields LONGBLOB, IN input LONGBLOB, OUT canon LONGBLOB)
    NO SQL SQL SECURITY INVOKER
BEGIN
    DECLARE given, declared_list, entry, fname, def, kind, lim, value LONGBLOB;
    DECLARE declared LONGBLOB DEFAULT '';
    DECLARE t VARCHAR(8);
    DECLARE i, e BIGINT;

    SET given = leasehold_json_scan(input, 'm', NULL, NULL);
    SET entry = SUBSTRING_INDEX(given, ';', 1), i = LENGTH(entry) + 2;
    SET canon = UNHEX(SUBSTRING_INDEX(SUBSTRING_INDEX(entry, ':', 2), ':', -1)), t = SUBSTRING_INDEX(entry, ':', -1);
    IF t <> 'object' THEN
        CALL leasehold_raise('22023', CONCAT('input: must be a JSON object, not ', t));
    END IF;
    IF LENGTH(canon) > 65536 THEN
        CALL leasehold_raise('22023', CONCAT('input: ', LENGTH(canon), ' bytes exceeds the limit of 65536 bytes'));
    END IF;

    -- The declared field names, in byte order, for a refusal that lists them.
    SET declared_list = leasehold_json_scan(fields, 'm', NULL, NULL);
    SET e = LOCATE(';', declared_list) + 1;
    WHILE e <= LENGTH(declared_list) DO
        SET entry = SUBSTRING(declared_list, e, LOCATE(';', declared_list, e) - e), e = e + LENGTH(entry) + 1;
        SET declared = CONCAT(declared, IF(declared = '', '', ', '), UNHEX(SUBSTRING_INDEX(entry, ':', 1)));
    END WHILE;

    WHILE i <= LENGTH(given) DO
        SET entry = SUBSTRING(given, i, LOCATE(';', given, i) - i), i = i + LENGTH(entry) + 1;
        SET fname = UNHEX(SUBSTRING_INDEX(entry, ':', 1)), def = leasehold_json_get(fields, fname);
        SET value = UNHEX(SUBSTRING_INDEX(SUBSTRING_INDEX(entry, ':', 2), ':', -1)), t = SUBSTRING_INDEX(entry, ':', -1);
        IF def IS NULL THEN
            CALL leasehold_raise('22023', CONCAT('input.', fname, ': is not a field of the plan''s [input] (fields: ',
                                                 declared, ')'));
        END IF;
        SET kind = leasehold_json_unquote(leasehold_json_get(def, 'type'));
        IF NOT (t = kind OR (kind = 'number' AND t = 'integer')) THEN
            CALL leasehold_raise('22023', CONCAT('input.', fname, ': expected ', kind, ', found ', t));
        END IF;
        SET lim = leasehold_json_get(def, 'max_bytes');
        IF lim IS NOT NULL AND LENGTH(value) > CAST(lim AS UNSIGNED) THEN
            CALL leasehold_raise('22023', CONCAT('input.', fname, ': ', LENGTH(value), ' bytes exceeds its max_bytes of ', lim));
        END IF;
    END WHILE;

    SET e = LOCATE(';', declared_list) + 1;
    WHILE e <= LENGTH(declared_list) DO
        SET entry = SUBSTRING(declared_list, e, LOCATE(';', declared_list, e) - e), e = e + LENGTH(entry) + 1;
        SET fname = UNHEX(SUBSTRING_INDEX(entry, ':', 1));
        SET def = UNHEX(SUBSTRING_INDEX(SUBSTRING_INDEX(entry, ':', 2), ':', -1));
        IF leasehold_json_get(def, 'required') = 'true' AND leasehold_json_member(canon, 1, fname) = 0 THEN
            CALL leasehold_raise('22023', CONCAT('input.', fname, ': is required'));
        END IF;
    END WHILE;
END $$

-- A step's canonical payload with every reference {"$input": "<pointer>"} replaced
-- by what the pointer names in the canonical input (engine/src/input.rs resolve):
-- a field the input leaves out gives null; a pointer below a given field that
-- names nothing is refused, naming where the reference stands from `place`
-- (`steps[0].payload`). In canonical text the bytes {"$input":" start a reference
-- and nothing else (a quote inside a string is escaped), and registration left
-- each reference that one key. References are replaced in document order, which
-- is the order serde_json walks a payload in (its objects' keys sorted).
DROP FUNCTION IF EXISTS leasehold_resolve $$
CREATE FUNCTION leasehold_resolve(payload LONGBLOB, input LONGBLOB, place LONGBLOB) RETURNS LONGBLOB
    DETERMINISTIC NO SQL SQL SECURITY INVOKER
BEGIN
    DECLARE out_ LONGBLOB DEFAULT '';
    DECLARE i BIGINT DEFAULT 1;
    DECLARE r, e BIGINT;
    DECLARE ptr, found, fname LONGBLOB;
    LOOP
        SET r = LOCATE('{"$input":"', payload, i);
        IF r = 0 THEN
            RETURN CONCAT(out_, SUBSTRING(payload, i));
        END IF;
        SET e = leasehold_json_string_end(payload, r + 10);
        SET ptr = leasehold_json_unquote(SUBSTRING(payload, r + 10, e - r - 10));
        SET found = leasehold_json_pointer(input, ptr);
        IF found IS NULL THEN
            SET fname = SUBSTRING_INDEX(TRIM(LEADING '/' FROM ptr), '/', 1);
            SET fname = REPLACE(REPLACE(fname, '~1', '/'), '~0', '~');
            IF leasehold_json_member(input, 1, fname) > 0 THEN
                CALL leasehold_raise('22023', CONCAT('input.', fname, ': ', leasehold_rust_debug(ptr),
                    ' names nothing in it, and ', leasehold_json_scan(payload, 'p', place, r), ' refers to it'));
            END IF;
            SET found = 'null';
        END IF;
        SET out_ = CONCAT(out_, SUBSTRING(payload, i, r - i), found), i = e + 1;
    END LOOP;
END $$

-- A plan's fingerprint from its row (engine/src/plan.rs plan_fingerprint): the
-- SHA-256 of the canonical JSON of {input?, name, on_failure?, queue?, recovery,
-- retry?, steps, volatile_fields}, the optional members where the column is set.
-- The members are written here in their canonical order.
DROP FUNCTION IF EXISTS leasehold_plan_fingerprint $$
CREATE FUNCTION leasehold_plan_fingerprint(plan_name LONGBLOB, recovery LONGBLOB, steps_json LONGBLOB,
                                           volatile_fields_json LONGBLOB, retry_json LONGBLOB, queue LONGBLOB,
                                           input_json LONGBLOB, on_failure LONGBLOB) RETURNS CHAR(64)
    DETERMINISTIC NO SQL SQL SECURITY INVOKER
RETURN SHA2(CONCAT('{',
    IF(input_json IS NULL, '', CONCAT('"input":', leasehold_canonical_json(input_json), ',')),
    '"name":', leasehold_json_string(plan_name),
    IF(on_failure IS NULL, '', CONCAT(',"on_failure":', leasehold_json_string(on_failure))),
    IF(queue IS NULL, '', CONCAT(',"queue":', leasehold_json_string(queue))),
    ',"recovery":', leasehold_json_string(recovery),
    IF(retry_json IS NULL, '', CONCAT(',"retry":', leasehold_canonical_json(retry_json))),
    ',"steps":', leasehold_canonical_json(steps_json),
    ',"volatile_fields":', leasehold_canonical_json(volatile_fields_json),
    '}'), 256) $$

-- 16 lowercase hex digits of RANDOM_BYTES(8), the server's cryptographic random
-- source. A server without it (MariaDB before 10.10) gets them from a digest of
-- UUID(), RAND() and the clock: unique, not secret (ids need not be).
DROP FUNCTION IF EXISTS leasehold_random_hex $$
CREATE FUNCTION leasehold_random_hex() RETURNS CHAR(16)
    NOT DETERMINISTIC NO SQL SQL SECURITY INVOKER
BEGIN
    DECLARE r VARBINARY(8);
    DECLARE CONTINUE HANDLER FOR 1305
        SET r = UNHEX(LEFT(SHA2(CONCAT(UUID(), RAND(), SYSDATE(6), CONNECTION_ID()), 256), 16));
    SET r = RANDOM_BYTES(8);
    RETURN LOWER(HEX(r));
END $$

-- Enqueues an execute attempt of plan `plan_id` in the caller's transaction, as
-- Outbox::enqueue_mysql_with does (src/ledger/mod.rs decide_enqueue, in the same
-- order of checks). The rows the decision depends on are read with locking reads,
-- so that a REPEATABLE READ caller decides on the latest committed rows: the plan
-- row first (which serializes the enqueues of a plan), then the attempt the
-- enqueue key names, the plan's open attempts and its highest number. The keys
-- are taken as text of any length, so that a key longer than 255 characters is
-- refused with the ledger's message rather than cut short by a session that is
-- not strict (and so read as another key).
DROP PROCEDURE IF EXISTS leasehold_enqueue $$
CREATE PROCEDURE leasehold_enqueue(
    IN plan_id VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN input LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN order_key LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN enqueue_key LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN after_ms BIGINT,
    OUT attempt_id VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    OUT created BOOLEAN)
    MODIFIES SQL DATA SQL SECURITY INVOKER
proc: BEGIN
    DECLARE p_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE p_status, p_recovery, p_on_failure VARCHAR(16) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE p_fingerprint CHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE p_name, p_steps, p_volatile, p_retry, p_queue, p_fields, p_targets LONGBLOB;
    DECLARE template BOOLEAN;
    DECLARE missing BOOLEAN DEFAULT FALSE;
    DECLARE now_ms, latest BIGINT;
    DECLARE steps, targets, fields, in_canon, payloads, step, payload, code, executor, target LONGBLOB;
    DECLARE first_executor, first_target LONGBLOB;
    DECLARE in_sha, req_sha, found_sha, computed, digest CHAR(64);
    DECLARE found_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE found_status VARCHAR(16);
    DECLARE att, cmd VARCHAR(64);
    DECLARE trace_id CHAR(32);
    DECLARE span_id CHAR(16);
    DECLARE command_status VARCHAR(16) DEFAULT 'PENDING';
    DECLARE i, e, ti, te, pi, pe, ordinal BIGINT;
    DECLARE wrote BOOLEAN DEFAULT FALSE;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET missing = TRUE;

    SET attempt_id = NULL, created = NULL;

    -- 1. The plan, locked.
    SELECT p.id, p.status, p.name, p.recovery, p.steps_json, p.volatile_fields_json, p.fingerprint, p.retry_json,
           p.queue, p.input_json, p.on_failure, p.targets_json
      INTO p_id, p_status, p_name, p_recovery, p_steps, p_volatile, p_fingerprint, p_retry,
           p_queue, p_fields, p_on_failure, p_targets
      FROM plan p WHERE p.id = plan_id FOR UPDATE;
    IF missing THEN
        CALL leasehold_raise('P0002', CONCAT('plan ', COALESCE(plan_id, ''), ' not found'));
    END IF;
    SET template = p_fields IS NOT NULL;

    -- 2. The database clock, whatever the session's time zone.
    SET now_ms = CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000 AS SIGNED);
    IF after_ms < 0 THEN
        CALL leasehold_raise('22023', 'after_ms: must not be negative');
    END IF;

    -- 3, 4. The order key, and what a plan without [input] takes.
    IF order_key IS NOT NULL THEN
        CALL leasehold_check_key('order_key', order_key);
    END IF;
    IF NOT template AND (input IS NOT NULL OR order_key IS NOT NULL) THEN
        CALL leasehold_raise('22023', CONCAT(IF(input IS NOT NULL, 'input', 'order_key'), ': plan ', p_id,
            ' declares no [input], so its attempts take neither input nor an order key'));
    END IF;

    -- 5. A template's input, checked, and each step's payload resolved from it.
    SET steps = leasehold_canonical_json(p_steps);
    IF template THEN
        SET fields = leasehold_canonical_json(p_fields);
        CALL leasehold_check_input(fields, COALESCE(input, '{}'), in_canon);
        SET in_sha = SHA2(in_canon, 256), payloads = '', i = 2, ordinal = 0;
        IF SUBSTRING(steps, 2, 1) <> ']' THEN
            resolve: LOOP
                SET e = leasehold_json_end(steps, i), step = SUBSTRING(steps, i, e - i);
                SET payload = leasehold_resolve(COALESCE(leasehold_json_get(step, 'payload'), '{}'), in_canon,
                                                CONCAT('steps[', ordinal, '].payload'));
                IF LENGTH(payload) > 65536 THEN
                    CALL leasehold_raise('22023', CONCAT('steps[', ordinal, '].payload: ', LENGTH(payload),
                        ' bytes once resolved from the input exceeds the limit of 65536 bytes'));
                END IF;
                SET payloads = CONCAT(payloads, IF(ordinal = 0, '', ','), payload);
                IF SUBSTRING(steps, e, 1) <> ',' THEN
                    LEAVE resolve;
                END IF;
                SET i = e + 1, ordinal = ordinal + 1;
            END LOOP resolve;
        END IF;
        SET payloads = CONCAT('[', payloads, ']');
    END IF;

    -- 6. The enqueue key: the attempt the same request enqueued is answered as it
    -- is, whatever became of the plan; another request's is a refusal. (The key is
    -- looked up as the unique key attempt_by_enqueue_key compares it.)
    IF enqueue_key IS NOT NULL THEN
        CALL leasehold_check_key('enqueue key', enqueue_key);
        SET req_sha = SHA2(CONCAT('{"action":"execute"',
            IF(template, CONCAT(',"input_sha256":"', in_sha, '"'), ''),
            IF(order_key IS NULL, '', CONCAT(',"order_key":', leasehold_json_string(order_key))),
            ',"plan":', leasehold_json_string(p_id),
            ',"start":', IF(after_ms IS NULL, '"now"', CONCAT('{"after":', after_ms, '}')),
            '}'), 256);
        SET missing = FALSE;
        SELECT a.id, a.request_sha256 INTO found_id, found_sha
          FROM attempt a WHERE a.enqueue_key = enqueue_key FOR UPDATE;
        IF NOT missing THEN
            IF found_sha = req_sha THEN
                SET attempt_id = found_id, created = FALSE;
                LEAVE proc;
            END IF;
            CALL leasehold_raise('55000', CONCAT('enqueue key ', leasehold_rust_debug(enqueue_key),
                ' was used by another request (attempt ', found_id, '): a key names one request'));
        END IF;
    END IF;

    -- 7. The plan's guard: READY, its content matching its fingerprint, and each
    -- step's target known.
    IF p_status <> 'READY' THEN
        CALL leasehold_raise('55000', CONCAT('execute refused: plan ', p_id, ' is ', p_status));
    END IF;
    SET computed = leasehold_plan_fingerprint(p_name, p_recovery, p_steps, p_volatile, p_retry, p_queue, p_fields,
                                              p_on_failure);
    IF computed <> p_fingerprint THEN
        CALL leasehold_raise('55000', CONCAT('execute refused: plan ', p_id, ': fingerprint: stored ', p_fingerprint,
                                             ' but the content hashes to ', computed));
    END IF;
    SET targets = IF(p_targets IS NULL, NULL, leasehold_canonical_json(p_targets)), i = 2, ti = 2, ordinal = 0;
    IF SUBSTRING(steps, 2, 1) <> ']' THEN
        routes: LOOP
            SET e = leasehold_json_end(steps, i), step = SUBSTRING(steps, i, e - i);
            IF targets IS NULL THEN
                IF leasehold_json_get(step, 'executor') = '"http:v1"' THEN
                    CALL leasehold_raise('55000', CONCAT('plan ', p_id,
                        ' was registered before its targets were stored: register it again'));
                END IF;
            ELSE
                IF SUBSTRING(targets, ti, 1) <> '"' THEN
                    CALL leasehold_raise('HY000', CONCAT('ledger integrity: plan ', p_id, ': targets_json has no target for steps[',
                                                         ordinal, ']'));
                END IF;
                SET ti = leasehold_json_end(targets, ti) + 1;
            END IF;
            IF SUBSTRING(steps, e, 1) <> ',' THEN
                LEAVE routes;
            END IF;
            SET i = e + 1, ordinal = ordinal + 1;
        END LOOP routes;
    END IF;

    -- 8. A plan without [input] runs one attempt at a time.
    IF NOT template THEN
        SET missing = FALSE;
        SELECT a.id, a.status INTO found_id, found_status
          FROM attempt a WHERE a.plan_id = p_id AND a.status IN ('QUEUED', 'RUNNING')
          ORDER BY a.number LIMIT 1 FOR UPDATE;
        IF NOT missing THEN
            CALL leasehold_raise('55000', CONCAT('execute refused: attempt ', found_id, ' is still ', found_status));
        END IF;
    END IF;

    -- 9. The next number; for an order key, whether an open attempt is ahead (the
    -- key compared byte for byte).
    SET missing = FALSE, latest = NULL;
    SELECT MAX(a.number) INTO latest FROM attempt a WHERE a.plan_id = p_id FOR UPDATE;
    IF template AND order_key IS NOT NULL THEN
        SET missing = FALSE;
        SELECT a.id INTO found_id
          FROM attempt a
         WHERE a.plan_id = p_id AND a.order_key = order_key AND CAST(a.order_key AS BINARY) = CAST(order_key AS BINARY)
           AND a.status IN ('QUEUED', 'RUNNING')
         ORDER BY a.number DESC LIMIT 1 FOR UPDATE;
        IF NOT missing THEN
            SET command_status = 'WAITING';
        END IF;
    END IF;

    -- 10. Ids: the clock's milliseconds (48 bits) and 64 random bits, in hex; the
    -- attempt's trace context, a new trace derived from its id.
    SET att = CONCAT('att-', LPAD(LOWER(HEX(now_ms & 281474976710655)), 12, '0'), '-', leasehold_random_hex());
    SET cmd = CONCAT('cmd-', LPAD(LOWER(HEX(now_ms & 281474976710655)), 12, '0'), '-', leasehold_random_hex());
    SET digest = SHA2(CONCAT('leasehold attempt trace', X'00', att), 256);
    SET trace_id = LEFT(digest, 32), span_id = SUBSTRING(digest, 33, 16);
    IF trace_id = REPEAT('0', 32) THEN
        SET trace_id = CONCAT(REPEAT('0', 30), '01');
    END IF;
    IF span_id = REPEAT('0', 16) THEN
        SET span_id = CONCAT(REPEAT('0', 14), '01');
    END IF;

    -- 11. The rows. Should a write fail, what this call wrote is removed again.
    writes: BEGIN
        DECLARE EXIT HANDLER FOR SQLEXCEPTION
        BEGIN
            IF wrote THEN
                DELETE FROM command WHERE command.attempt_id = att;
                DELETE FROM receipt WHERE receipt.attempt_id = att;
                DELETE FROM attempt WHERE attempt.id = att;
            END IF;
            RESIGNAL;
        END;
        INSERT INTO attempt (id, plan_id, number, action, status, created_at, traceparent, enqueue_key,
                             request_sha256, input_json, input_sha256, order_key)
        VALUES (att, p_id, COALESCE(latest, 0) + 1, 'execute', 'QUEUED', now_ms,
                CONCAT('00-', trace_id, '-', span_id, '-01'), enqueue_key, req_sha, in_canon, in_sha,
                IF(template, order_key, NULL));
        SET wrote = TRUE, i = 2, ti = 2, pi = 2, ordinal = 1;
        IF SUBSTRING(steps, 2, 1) <> ']' THEN
            receipts: LOOP
                SET e = leasehold_json_end(steps, i), step = SUBSTRING(steps, i, e - i);
                SET code = leasehold_json_unquote(leasehold_json_get(step, 'code'));
                SET executor = leasehold_json_unquote(leasehold_json_get(step, 'executor'));
                IF targets IS NULL THEN
                    SET target = COALESCE(leasehold_json_unquote(leasehold_json_get(step, 'target')), executor);
                ELSE
                    SET te = leasehold_json_end(targets, ti);
                    SET target = leasehold_json_unquote(SUBSTRING(targets, ti, te - ti)), ti = te + 1;
                END IF;
                IF template THEN
                    SET pe = leasehold_json_end(payloads, pi);
                    SET payload = SUBSTRING(payloads, pi, pe - pi), pi = pe + 1;
                ELSE
                    SET payload = NULL;
                END IF;
                INSERT INTO receipt (attempt_id, ordinal, step_code, idempotency_key, status, executor, target, payload)
                VALUES (att, ordinal, code, CONCAT('ik-', LEFT(SHA2(CONCAT(att, X'00', ordinal, X'00', code), 256), 32)),
                        'PENDING', executor, target, payload);
                IF ordinal = 1 THEN
                    SET first_executor = executor, first_target = target;
                END IF;
                IF SUBSTRING(steps, e, 1) <> ',' THEN
                    LEAVE receipts;
                END IF;
                SET i = e + 1, ordinal = ordinal + 1;
            END LOOP receipts;
        END IF;
        INSERT INTO command (id, attempt_id, status, available_at, delivery_count, queue, executor, target)
        VALUES (cmd, att, command_status,
                CASE WHEN after_ms IS NULL THEN now_ms
                     WHEN after_ms > 9223372036854775807 - now_ms THEN 9223372036854775807
                     ELSE now_ms + after_ms END,
                0, COALESCE(p_queue, 'default'), COALESCE(first_executor, ''), COALESCE(first_target, ''));
    END writes;

    SET attempt_id = att, created = TRUE;
END $$

DELIMITER ;
