"""Starting workers (jobs/launch.py): what an installation names on the shared host is its own,
so two DeepPod servers on one machine never share a tenant's OS user or a job's shared memory."""

from deeppod.auth.identities import FakeIdentities, tenant_identity
from deeppod.jobs.launch import Isolation, shm_name
from deeppod.settings import Settings
from deeppod.store.models import Tenant
from tests.fixtures import populate


def test_two_installations_on_one_host_name_their_tenants_and_shared_memory_apart(tmp_path):
    a, b = Settings(home=tmp_path / "a").instance, Settings(home=tmp_path / "b").instance
    assert a != b and a == Settings(home=tmp_path / "a").instance  # stable across restarts of one home
    ia, ib = Isolation(FakeIdentities(), (), instance=a), Isolation(FakeIdentities(), (), instance=b)
    assert ia.user_prefix != ib.user_prefix and shm_name(a, 1) != shm_name(b, 1)
    assert len(f"{ia.user_prefix}{10**9}") <= 32  # Linux user names end at 32 characters


def test_a_tenant_keeps_the_os_user_it_was_given(sessions):
    world = populate(sessions)
    ids = FakeIdentities()
    with sessions.begin() as s:
        tenant_id = s.get(Tenant, world.alice.tenant_id).id
        first = tenant_identity(s, ids, tenant_id, "deeppod-0123abcd-t")
    assert first.user == f"deeppod-0123abcd-t{tenant_id}"
    with sessions.begin() as s:  # recorded: another prefix later (an older server's) does not rename it
        again = tenant_identity(s, ids, tenant_id, "deeppod-t")
        assert again == first and s.get(Tenant, tenant_id).os_user == first.user
