-- Named API tokens with scopes, for the admin calls and the edge.
--
-- Only a token's SHA-256 digest is stored: a copy of this table (a backup, a replica, a
-- leaked dump) holds nothing that authenticates. The secret is shown once, when the token
-- is made (`voucher-core tokens create`). Several tokens may be valid at once, so one is
-- rotated by making its successor, moving its users over and revoking it, without a
-- restart: the cores re-read this table every `admin.token_refresh`.
CREATE TABLE api_tokens (
    -- Who the token is for ("ops-alice", "edge-eu1"): what the audit trail names.
    name           TEXT         NOT NULL,
    secret_sha256  BYTEA        NOT NULL,
    scopes         TEXT[]       NOT NULL,
    created_at     TIMESTAMPTZ  NOT NULL DEFAULT now(),
    -- Refused from then on (null: never).
    expires_at     TIMESTAMPTZ,
    revoked_at     TIMESTAMPTZ,

    CONSTRAINT api_tokens_pkey PRIMARY KEY (name),
    CONSTRAINT api_tokens_secret_key UNIQUE (secret_sha256),
    CONSTRAINT api_tokens_digest_length CHECK (octet_length(secret_sha256) = 32),
    CONSTRAINT api_tokens_name_valid CHECK (name ~ '^[a-z0-9][a-z0-9._-]{0,62}$'),
    CONSTRAINT api_tokens_scopes_known CHECK (
        cardinality(scopes) > 0
        AND scopes <@ ARRAY['vouchers:write', 'vouchers:read', 'orders:read', 'audit:read']
    )
);
