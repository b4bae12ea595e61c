-- Where the writers of reservation events are, per partition of the events topic.
--
-- Partitions are owned through PostgreSQL, not through the broker's consumer group: a core
-- writes a partition only while its session holds the partition's advisory lock, and it
-- stores the partition's next offset here, on that same session. A core that dies loses its
-- session, hence its lock, at once; another core takes the partition over and goes on from
-- the offset stored here. Rows are idempotent by orderId, so a batch replayed after a crash
-- changes nothing.

CREATE TABLE consumer_offsets (
    -- The writers' name (`kafka.group`): a second name reads the topic again from the start.
    group_name   TEXT         NOT NULL,
    topic        TEXT         NOT NULL,
    partition    INTEGER      NOT NULL,
    -- The first offset not yet written.
    next_offset  BIGINT       NOT NULL,
    -- The instance that stored it last, for operators.
    owner        TEXT         NOT NULL,
    updated_at   TIMESTAMPTZ  NOT NULL DEFAULT now(),

    CONSTRAINT consumer_offsets_pkey PRIMARY KEY (group_name, topic, partition),
    CONSTRAINT consumer_offsets_not_negative CHECK (next_offset >= 0)
);
