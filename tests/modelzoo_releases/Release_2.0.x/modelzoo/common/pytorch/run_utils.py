"""A short training loop on the cstorch API, called as the Model Zoo's run.py calls its flow."""

import argparse

import yaml

import cerebras_pytorch as cstorch


def get_params_from_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("target_device", choices=["CPU", "CSX"])
    parser.add_argument("--mode", default="train")
    parser.add_argument("--params", required=True)
    parser.add_argument("--model_dir", default="./model_dir")
    args = parser.parse_args()
    with open(args.params) as f:
        params = yaml.safe_load(f)
    params["runconfig"].update(target_device=args.target_device, model_dir=args.model_dir)
    return params


def main(params, model_fn, train_input_fn, eval_input_fn):
    runconfig = params["runconfig"]
    backend = cstorch.backend(runconfig["target_device"],
                              artifact_dir=f"{runconfig['model_dir']}/cerebras_logs")
    with backend.device:
        model = model_fn(params)
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.configure_optimizer(
        optimizer_type=params["optimizer"]["optimizer_type"], params=model.parameters(),
        lr=params["optimizer"]["learning_rate"])

    @cstorch.trace
    def training_step(batch):
        loss = compiled(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    dataloader = cstorch.utils.data.DataLoader(train_input_fn, params)
    executor = cstorch.utils.data.DataExecutor(
        dataloader, num_steps=runconfig["max_steps"],
        cs_config=cstorch.utils.CSConfig(num_csx=1, num_workers_per_csx=1))
    for batch in executor:
        training_step(batch)
    print("Training completed successfully!")
