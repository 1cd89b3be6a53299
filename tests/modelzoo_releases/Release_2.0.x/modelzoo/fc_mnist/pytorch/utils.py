def set_defaults(params):
    params["train_input"].setdefault("drop_last_batch", True)
    params.setdefault("eval_input", {}).setdefault("drop_last_batch", True)
    return params
