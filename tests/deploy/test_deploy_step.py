"""deploy_model's work without KFP (components/deploy/run.py): what it serves when the comparison lists nothing. The
serving itself, through the component: tests/deploy/test_serving_variants.py."""

from components.deploy.run import serve_list
from components.settings import defaults


def test_a_run_without_variants_serves_its_model_alone_under_serving_name():
    settings = {**defaults(), "method": "lora", "merge_lora": False}
    assert serve_list([], model_path="/m/runs/r/train/final", settings=settings, serving_name="chat") == [
        {
            "variant": "",
            "model_path": "/m/runs/r/train/final",
            "settings": settings,
            "adapter": True,
            "served_model_name": "chat",
        }
    ]


def test_the_comparisons_list_is_served_as_it_is():
    listed = [{"variant": "a", "model_path": "/m/a/final", "served_model_name": "chat-a"}]
    assert serve_list(listed, model_path="/m/a/final", settings=defaults(), serving_name="chat") is listed
