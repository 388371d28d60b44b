from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WatchStatusRequest(_message.Message):
    __slots__ = ("interval_s",)
    INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    interval_s: float
    def __init__(self, interval_s: _Optional[float] = ...) -> None: ...

class Status(_message.Message):
    __slots__ = ("policy_version", "controller", "ready", "draining", "unix_time_s", "pools", "gateway", "status_json")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    UNIX_TIME_S_FIELD_NUMBER: _ClassVar[int]
    POOLS_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_FIELD_NUMBER: _ClassVar[int]
    STATUS_JSON_FIELD_NUMBER: _ClassVar[int]
    policy_version: str
    controller: str
    ready: bool
    draining: bool
    unix_time_s: float
    pools: _containers.RepeatedCompositeFieldContainer[Pool]
    gateway: Gateway
    status_json: str
    def __init__(self, policy_version: _Optional[str] = ..., controller: _Optional[str] = ..., ready: _Optional[bool] = ..., draining: _Optional[bool] = ..., unix_time_s: _Optional[float] = ..., pools: _Optional[_Iterable[_Union[Pool, _Mapping]]] = ..., gateway: _Optional[_Union[Gateway, _Mapping]] = ..., status_json: _Optional[str] = ...) -> None: ...

class Gateway(_message.Message):
    __slots__ = ("checks_held", "open_tickets")
    CHECKS_HELD_FIELD_NUMBER: _ClassVar[int]
    OPEN_TICKETS_FIELD_NUMBER: _ClassVar[int]
    checks_held: int
    open_tickets: int
    def __init__(self, checks_held: _Optional[int] = ..., open_tickets: _Optional[int] = ...) -> None: ...

class Pool(_message.Message):
    __slots__ = ("name", "limit", "unit", "inflight", "inflight_requests", "saturation", "breaker", "override", "classes", "backends")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    SATURATION_FIELD_NUMBER: _ClassVar[int]
    BREAKER_FIELD_NUMBER: _ClassVar[int]
    OVERRIDE_FIELD_NUMBER: _ClassVar[int]
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    BACKENDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    limit: float
    unit: str
    inflight: float
    inflight_requests: int
    saturation: float
    breaker: str
    override: LimitOverride
    classes: _containers.RepeatedCompositeFieldContainer[Class]
    backends: _containers.RepeatedCompositeFieldContainer[Backend]
    def __init__(self, name: _Optional[str] = ..., limit: _Optional[float] = ..., unit: _Optional[str] = ..., inflight: _Optional[float] = ..., inflight_requests: _Optional[int] = ..., saturation: _Optional[float] = ..., breaker: _Optional[str] = ..., override: _Optional[_Union[LimitOverride, _Mapping]] = ..., classes: _Optional[_Iterable[_Union[Class, _Mapping]]] = ..., backends: _Optional[_Iterable[_Union[Backend, _Mapping]]] = ...) -> None: ...

class Class(_message.Message):
    __slots__ = ("priority", "name", "queue_depth", "oldest_wait_s", "inflight", "slo_attainment", "admitted_per_s", "shed_per_s")
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    OLDEST_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    SLO_ATTAINMENT_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_PER_S_FIELD_NUMBER: _ClassVar[int]
    SHED_PER_S_FIELD_NUMBER: _ClassVar[int]
    priority: int
    name: str
    queue_depth: int
    oldest_wait_s: float
    inflight: float
    slo_attainment: float
    admitted_per_s: float
    shed_per_s: float
    def __init__(self, priority: _Optional[int] = ..., name: _Optional[str] = ..., queue_depth: _Optional[int] = ..., oldest_wait_s: _Optional[float] = ..., inflight: _Optional[float] = ..., slo_attainment: _Optional[float] = ..., admitted_per_s: _Optional[float] = ..., shed_per_s: _Optional[float] = ...) -> None: ...

class Backend(_message.Message):
    __slots__ = ("name", "ok", "age_s", "kv_usage", "waiting", "running", "ttft_p90_s", "itl_p90_s")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    KV_USAGE_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    TTFT_P90_S_FIELD_NUMBER: _ClassVar[int]
    ITL_P90_S_FIELD_NUMBER: _ClassVar[int]
    name: str
    ok: bool
    age_s: float
    kv_usage: float
    waiting: float
    running: float
    ttft_p90_s: float
    itl_p90_s: float
    def __init__(self, name: _Optional[str] = ..., ok: _Optional[bool] = ..., age_s: _Optional[float] = ..., kv_usage: _Optional[float] = ..., waiting: _Optional[float] = ..., running: _Optional[float] = ..., ttft_p90_s: _Optional[float] = ..., itl_p90_s: _Optional[float] = ...) -> None: ...

class LimitOverride(_message.Message):
    __slots__ = ("pool", "active", "limit", "expires_in_s")
    POOL_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_S_FIELD_NUMBER: _ClassVar[int]
    pool: str
    active: bool
    limit: float
    expires_in_s: float
    def __init__(self, pool: _Optional[str] = ..., active: _Optional[bool] = ..., limit: _Optional[float] = ..., expires_in_s: _Optional[float] = ...) -> None: ...

class SetLimitOverrideRequest(_message.Message):
    __slots__ = ("pool", "limit", "duration_s")
    POOL_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    pool: str
    limit: float
    duration_s: float
    def __init__(self, pool: _Optional[str] = ..., limit: _Optional[float] = ..., duration_s: _Optional[float] = ...) -> None: ...

class ClearLimitOverrideRequest(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: str
    def __init__(self, pool: _Optional[str] = ...) -> None: ...
