"""Hypothesis strategies for MOQT values that every draft's message tests share."""

from __future__ import annotations

from hypothesis import strategies as st

from moqt.kinds import AliasType
from moqt.params import AuthToken
from moqt.wire import VARINT_MAX, Location

varint = st.integers(0, VARINT_MAX)
locations = st.builds(Location, varint, varint)
#: AUTHORIZATION_TOKEN values of each alias type (section "Authorization Token")
tokens = st.one_of(
    st.builds(AuthToken.use_value, varint, st.binary(max_size=16)),
    st.builds(lambda a, t, v: AuthToken(AliasType.REGISTER, a, t, v), varint, varint, st.binary(max_size=16)),
    st.builds(lambda a: AuthToken(AliasType.USE_ALIAS, a), varint),
    st.builds(lambda a: AuthToken(AliasType.DELETE, a), varint),
)
